#!/usr/bin/env python3
"""Strata against llama.cpp, an independent implementation, on the same GGUF files: random-weight
files of real shapes (`strata gguf synth`) of each architecture, the last position's logits over a
fixed prompt (relative RMS of the difference, and the same greedy continuation), and files that
llama.cpp's own llama-quantize made from the F16 one (Strata's error against llama.cpp's F16
logits within 10% of llama.cpp's own error).

It needs llama.cpp's tools, which ../shared/reference/build-llama-cpp.sh builds (10-15 minutes),
so it is not part of the CTest suite; docs/TESTING.md records its results.

usage: llama_cpp_check.py STRATA STRATA_LOGITS LLAMA_BIN [--work DIR] [--only NAME,...]
  STRATA         build/strata
  STRATA_LOGITS  build/tests/model/strata_logits
  LLAMA_BIN      the folder with llama_logits and llama-quantize (e.g. /tmp/llama.cpp-ref/build/bin)
"""
import argparse
import math
import os
import subprocess
import sys
import tempfile

# (name, synth shape, layers written (0: all), weight type, greedy tokens to compare, quantized types)
CASES = [
    ("llama (existing path, the baseline)", "llama-110m", 2, "F32", 32,
     ["Q4_K_M", "Q8_0", "Q3_K_M", "Q2_K", "IQ4_NL", "IQ4_XS"]),
    ("qwen3", "qwen3-0.6b", 2, "F32", 32, ["Q4_K_M", "Q8_0", "Q2_K", "Q3_K_S", "Q3_K_M", "Q3_K_L", "IQ4_XS"]),
    ("qwen3 (small)", "qwen3-tiny", 0, "F32", 32, []),
    # MXFP4_MOE: llama-quantize's MXFP4 experts with everything else Q8_0, as gpt-oss ships.
    ("qwen3moe (small)", "qwen3moe-tiny", 0, "F32", 32, ["Q4_K_M", "MXFP4_MOE", "IQ4_XS"]),
    ("qwen3moe (Qwen3-30B-A3B's dimensions)", "qwen3-30b-a3b", 1, "F16", 8, ["Q4_K_M", "MXFP4_MOE"]),
    ("Mixtral (8x7B's dimensions)", "mixtral-8x7b", 1, "F16", 8, []),
    ("gpt-oss (small: sinks, YaRN, a window of 12 in the even layers)", "gpt-oss-tiny", 0, "F32", 32, ["Q4_0", "MXFP4_MOE"]),
    ("gpt-oss (gpt-oss-20b's dimensions)", "gpt-oss-20b", 2, "F16", 8, ["Q8_0"]),
    ("gemma3 (small: a window of 12 in 5 of 6 layers, RoPE scaling on the global one)", "gemma3-tiny", 0, "F32", 32,
     ["Q8_0", "Q4_0"]),
    ("gemma3 (Gemma 3 4B's dimensions, 5 local layers and the first global one)", "gemma-3-4b", 6, "F16", 8,
     ["Q4_K_M"]),
    ("phi3 (small)", "phi3-tiny", 0, "F32", 32, ["Q8_0"]),
    ("phi3 (Phi-3-mini-4k's dimensions)", "phi-3-mini", 2, "F32", 32, ["Q4_K_M", "Q8_0"]),
    ("phi3 (small, LongRoPE: the long factors and the attention factor)", "phi3-longrope-tiny", 0, "F32", 32, ["Q8_0"]),
    ("phi3 (Phi-4's dimensions)", "phi-4", 1, "F16", 8, []),
    # No quantized file: the prompt's last position is within 0.002 of another choice of experts
    # in its first MoE layer (docs/TESTING.md), which quantization error decides.
    ("glm4moe (small)", "glm4moe-tiny", 0, "F32", 32, []),
    ("glm4moe (GLM-4.5-Air's dimensions: the dense layer and an MoE layer)", "glm-4.5-air", 2, "F16", 8, ["Q4_K_M"]),
    ("deepseek2 (small: latent attention with a query bottleneck, 4 of 16 experts in 2 of 4 groups, a shared one, "
     "YaRN)", "deepseek2-tiny", 0, "F32", 32, []),
    # llama.cpp tells a file without the query bottleneck by its layer count (V2-Lite's 27). One greedy token: the
    # second is a near-tie (logits 3.48632 and 3.48618 in Strata, 3.48620 and 3.48648 in llama.cpp), which the
    # double-precision reference decides as Strata does (docs/TESTING.md).
    ("deepseek2 (small, V2-Lite's kind: no query bottleneck, softmax routing, 27 layers)", "deepseek2-lite-tiny", 0,
     "F32", 1, []),
    ("deepseek2 (DeepSeek-V3's dimensions: its first, dense layer)", "deepseek-v3", 1, "F16", 8, ["Q4_K_M"]),
]
PROMPT = [1, 2, 300, 400, 17, 99, 123, 500, 42, 7, 260, 1000, 77, 31, 5, 600]
FAILURES = []


def check(condition, message):
    print(("PASS " if condition else "FAIL ") + message, flush=True)
    if not condition:
        FAILURES.append(message)


def logits(tool, model, tokens):
    out = subprocess.run([tool, model, ",".join(map(str, tokens)), "f32"], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"{os.path.basename(tool)} failed on {model}: {out.stderr[-2000:]}")
    return [float(line) for line in out.stdout.split()]


def rms(values):
    return math.sqrt(sum(v * v for v in values) / len(values))


def relative_rms(got, want):
    return rms([g - w for g, w in zip(got, want)]) / rms(want)


def argmax(values):
    return max(range(len(values)), key=values.__getitem__)


def greedy(tool, model, tokens, count):
    tokens = list(tokens)
    chosen = []
    for _ in range(count):
        chosen.append(argmax(logits(tool, model, tokens)))
        tokens.append(chosen[-1])
    return chosen


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("strata")
    parser.add_argument("strata_logits")
    parser.add_argument("llama_bin")
    parser.add_argument("--work", default=None, help="folder for the model files (default: a temporary one)")
    parser.add_argument("--only", default="", help="synth shapes to check, comma-separated")
    args = parser.parse_args()
    llama_logits = os.path.join(args.llama_bin, "llama_logits")
    quantize = os.path.join(args.llama_bin, "llama-quantize")
    only = set(filter(None, args.only.split(",")))
    with tempfile.TemporaryDirectory(dir=args.work) as work:
        for label, shape, layers, weight_type, greedy_count, quantized in CASES:
            if only and shape not in only:
                continue
            path = os.path.join(work, f"{shape}-{weight_type}.gguf")
            synth = [args.strata, "gguf", "synth", "--shape", shape, "--type", weight_type, "-o", path]
            subprocess.run(synth + (["--layers", str(layers)] if layers else []), check=True, capture_output=True)
            want = logits(llama_logits, path, PROMPT)
            got = logits(args.strata_logits, path, PROMPT)
            error = relative_rms(got, want)
            check(len(got) == len(want) and error <= 0.005,
                  f"{label}, {weight_type}: last-position logits, relative RMS {error:.2e} (<= 0.005)")
            ours, theirs = greedy(args.strata_logits, path, PROMPT, greedy_count), greedy(llama_logits, path, PROMPT, greedy_count)
            check(ours == theirs, f"{label}, {weight_type}: the same {greedy_count} greedy tokens"
                                  + ("" if ours == theirs else f" (Strata {ours}, llama.cpp {theirs})"))
            for kind in quantized:
                quantized_path = os.path.join(work, f"{shape}-{kind}.gguf")
                subprocess.run([quantize, path, quantized_path, kind], check=True, capture_output=True)
                ours_error = relative_rms(logits(args.strata_logits, quantized_path, PROMPT), want)
                theirs_error = relative_rms(logits(llama_logits, quantized_path, PROMPT), want)
                check(ours_error <= 1.1 * theirs_error,
                      f"{label}, llama-quantize {kind}: error against llama.cpp's {weight_type} logits, Strata "
                      f"{ours_error:.4f}, llama.cpp {theirs_error:.4f} (Strata's within 10% of llama.cpp's)")
                os.unlink(quantized_path)
            os.unlink(path)
    print(f"{len(FAILURES)} failed" if FAILURES else "llama.cpp check: all passed")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
