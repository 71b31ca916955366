#!/usr/bin/env bash
# Builds the tensor and model tests for aarch64 and runs them under qemu-user on a CPU with
# the dot-product extension (max) and on one without it (cortex-a53); then the shared model's
# logits there must equal this machine's byte for byte.
# usage: aarch64_test.sh SOURCE_DIR CROSS_BUILD_DIR CMAKE_GENERATOR HOST_LOGITS_DUMP
set -euo pipefail
source_dir=$1 build_dir=$2 generator=$3 host_dump=$4

missing=()
for tool in aarch64-linux-gnu-g++ qemu-aarch64; do
  command -v "$tool" >/dev/null || missing+=("$tool")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "SKIP aarch64: ${missing[*]} not installed (scripts/install-deps.sh installs them)"
  exit 0
fi

cmake -S "$source_dir" -B "$build_dir" -G "$generator" -DCMAKE_BUILD_TYPE=Release -DSTRATA_CORE_ONLY=ON \
  -DCMAKE_TOOLCHAIN_FILE="$source_dir/cmake/toolchains/aarch64-linux-gnu-gcc.cmake" >/dev/null
cmake --build "$build_dir" --target tensor_test model_test model_logits_dump

# Under emulation only what the architecture changes: the kernels (all of tensor_test), the
# kernel paths against each other, the greedy tokens against the double-precision reference,
# and (once) every weight type against it. Threads, chunks and batching run the same code on
# every architecture; the native suite covers them.
same_on_every_cpu='BitExactAcrossIsas.*:ModelVsReference.*'
"$host_dump" "$build_dir/logits_host.bin"
export QEMU_LD_PREFIX=/usr/aarch64-linux-gnu
# Each CPU model must get its own fastest path (tensor_test's DetectedIsaIsTheOneThisCpuShouldGet
# and the dump's own report): max has the dot-product extension, a Cortex-A53 has not.
for cpu_isa in max:neon-dotprod cortex-a53:neon; do
  cpu=${cpu_isa%%:*}
  export QEMU_CPU=$cpu STRATA_EXPECTED_ISA=${cpu_isa#*:}
  echo "== aarch64, QEMU_CPU=$cpu, expecting the $STRATA_EXPECTED_ISA path"
  model_tests=$same_on_every_cpu
  if [ "$cpu" = max ]; then model_tests+=':EveryType/SyntheticVsReference.*'; fi
  qemu-aarch64 "$build_dir/tests/tensor/tensor_test" --gtest_brief=1
  qemu-aarch64 "$build_dir/tests/model/model_test" --gtest_brief=1 --gtest_filter="$model_tests"
  report=$(qemu-aarch64 "$build_dir/tests/model/model_logits_dump" "$build_dir/logits_$cpu.bin")
  echo "$report"
  grep -q "on the $STRATA_EXPECTED_ISA path" <<<"$report"
  cmp "$build_dir/logits_host.bin" "$build_dir/logits_$cpu.bin"
  echo "logits on aarch64 ($cpu, $STRATA_EXPECTED_ISA) equal this machine's byte for byte"
done
