#!/usr/bin/env python3
"""Strata's tokenizer beside llama.cpp's, an independent implementation, on the vocabularies and
texts of the model-family test (tokenizer_families_test): for every text of every family the ids
of Strata, of llama.cpp's llama-tokenize and of Hugging Face's tokenizers.js (the test's
expectation), with where and how they part.

llama.cpp is not built in CI, so this is not part of the CTest suite; docs/TESTING.md records
its results.

usage: llama_cpp_check.py STRATA_TOKENIZE LLAMA_TOKENIZE REFERENCE_DIR
  STRATA_TOKENIZE  build/tests/tokenizer/strata_tokenize
  LLAMA_TOKENIZE   llama.cpp's llama-tokenize (cmake --build BUILD --target llama-tokenize)
  REFERENCE_DIR    build/tokenizer-reference, which `ctest -R tokenizer_reference_vectors` fills
Exits 1 when Strata and Hugging Face differ anywhere (the CTest test would fail too).
"""
import json
import os
import subprocess
import sys
import tempfile
import time

SEPARATOR = "\n__ggml_vocab_test__\n"
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "gguf"))
from independent_reader import Reader  # noqa: E402


def read_texts(path):
    with open(path, encoding="utf-8", newline="") as f:
        return f.read().split(SEPARATOR)[:-1]


def read_ids(lines):
    return [[int(i) for i in line.split()] for line in lines]


def read_token_texts(path):
    """tokenizer.ggml.tokens of a GGUF file, to show the pieces where encodings differ."""
    with open(path, "rb") as f:
        r = Reader(f.read())
    r.pos = 16  # magic, version, tensor count
    for _ in range(r.take("<Q")):
        key = r.string()
        value = r.value(r.take("<I"))
        if key == "tokenizer.ggml.tokens":
            return value
    raise ValueError(f"{path} has no tokenizer.ggml.tokens")


def llama_cpp_ids(llama_tokenize, vocabulary, text):
    # Strings as they are (--no-escape), special-token text parsed (the default), no BOS.
    with tempfile.NamedTemporaryFile("w", encoding="utf-8", newline="", suffix=".txt") as f:
        f.write(text)
        f.flush()
        out = subprocess.run([llama_tokenize, "-m", vocabulary, "-f", f.name, "--ids", "--no-bos",
                              "--no-escape", "--log-disable"], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"llama-tokenize failed on {vocabulary}: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def gpt2_byte_of_character():
    """GPT-2's byte alphabet backwards: printable Latin-1 bytes stand for themselves, the other 68
    bytes for U+0100 upwards in byte order."""
    printable = [b for b in range(256) if 0x21 <= b <= 0x7E or 0xA1 <= b <= 0xAC or b >= 0xAE]
    others = [b for b in range(256) if b not in printable]
    table = {chr(b): b for b in printable}
    table.update({chr(0x100 + i): b for i, b in enumerate(others)})
    return table


BYTE_OF_CHARACTER = gpt2_byte_of_character()


def readable(token_text, model):
    """A byte-level token as the text it stands for (bytes of a split character escaped)."""
    if model != "gpt2" or any(c not in BYTE_OF_CHARACTER for c in token_text):
        return token_text
    return bytes(BYTE_OF_CHARACTER[c] for c in token_text).decode("utf-8", "backslashreplace")


def first_difference(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def pieces(token_texts, model, ids, start, count=6):
    shown = [repr(readable(token_texts[i], model)) for i in ids[start:start + count]]
    return " ".join(shown) or "(end)"


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    strata_tokenize, llama_tokenize, reference_dir = sys.argv[1:]
    with open(os.path.join(HERE, "families.json"), encoding="utf-8") as f:
        families = json.load(f)
    with open(os.path.join(HERE, "corpus.json"), encoding="utf-8") as f:
        names = [entry["name"] for entry in json.load(f)]

    strata_differs_from_reference = False
    for family in families:
        vocabulary = os.path.join(reference_dir, f"ggml-vocab-{family['name']}.gguf")
        texts = read_texts(vocabulary + ".inp")
        if len(texts) != len(names):
            sys.exit(f"{vocabulary}.inp has {len(texts)} texts, corpus.json {len(names)}: "
                     "run ctest -R tokenizer_reference_vectors")
        with open(vocabulary + ".out", encoding="utf-8") as f:
            reference = read_ids(f.read().splitlines())
        started = time.monotonic()
        strata_out = subprocess.run([strata_tokenize, vocabulary, vocabulary + ".inp"],
                                    capture_output=True, text=True, check=True).stdout
        strata = read_ids(strata_out.splitlines())
        strata_seconds = time.monotonic() - started
        started = time.monotonic()
        llama = [llama_cpp_ids(llama_tokenize, vocabulary, text) for text in texts]
        llama_seconds = time.monotonic() - started
        token_texts = read_token_texts(vocabulary)

        same = lambda a, b: sum(x == y for x, y in zip(a, b))
        print(f"{family['name']} ({family['model']}, pre {family['pre']}): "
              f"Strata = Hugging Face on {same(strata, reference)}/{len(texts)} texts, "
              f"llama.cpp = Hugging Face on {same(llama, reference)}/{len(texts)}, "
              f"llama.cpp = Strata on {same(llama, strata)}/{len(texts)} "
              f"(Strata {strata_seconds:.1f} s for all, llama-tokenize {llama_seconds:.1f} s "
              "one process per text)")
        for i, name in enumerate(names):
            if strata[i] == reference[i] == llama[i]:
                continue
            strata_differs_from_reference |= strata[i] != reference[i]
            agree = ("Strata = Hugging Face" if strata[i] == reference[i] else
                     "llama.cpp = Hugging Face" if llama[i] == reference[i] else "all three differ")
            encodings = (("Hugging Face", reference[i]), ("Strata", strata[i]),
                         ("llama.cpp", llama[i]))
            at = min(first_difference(a, b) for _, a in encodings for _, b in encodings if a != b)
            print(f"  {name} ({agree}): from token {at} of {len(reference[i])}")
            for label, ids in encodings:
                print(f"    {label:12} {pieces(token_texts, family['model'], ids, at)}")
    return 1 if strata_differs_from_reference else 0


if __name__ == "__main__":
    sys.exit(main())
