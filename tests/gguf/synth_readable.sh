#!/usr/bin/env bash
# Files from `strata gguf synth` read cleanly with an independent reader written from the spec.
# Usage: synth_readable.sh STRATA_BINARY
set -euo pipefail
strata=$1
here=$(cd "$(dirname "$0")" && pwd)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
for spec in llama-110m:Q4_0 demo:Q4_K_M demo:Q5_K_M demo:Q3_K_M demo:Q2_K demo:F16 demo:BF16 qwen2-tiny:Q8_0 \
            qwen2-tiny:Q6_K qwen3-tiny:Q8_0 qwen3moe-tiny:Q4_0 gpt-oss-tiny:Q8_0 gemma3-tiny:Q4_0 \
            phi3-tiny:Q8_0 glm4moe-tiny:Q4_0 demo:IQ4_NL demo:IQ4_XS qwen3moe-tiny:MXFP4 gpt-oss-tiny:MXFP4; do
  shape=${spec%%:*}
  type=${spec##*:}
  "$strata" gguf synth --shape "$shape" --type "$type" -o "$dir/model.gguf" 2>/dev/null
  python3 "$here/independent_reader.py" "$dir/model.gguf"
done
