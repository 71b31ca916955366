#!/usr/bin/env bash
# Builds the tensor and model tests for aarch64 and runs them under qemu-user on a CPU with
# the dot-product extension (max) and on one without it (cortex-a53); then the logits of the
# shared model and of small models of the newer architectures (experts, sinks, sliding
# windows: tests/model/logits_dump.cpp) there must equal this machine's byte for byte. GCC
# builds everything below; clang, where installed, builds the kernels' tests and the logits
# dump again (into CROSS_BUILD_DIR-clang), so that both compilers' NEON code is held to the
# same bits.
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

cross_build() {  # DIR TOOLCHAIN TARGET...
  local dir=$1 toolchain=$2
  shift 2
  cmake -S "$source_dir" -B "$dir" -G "$generator" -DCMAKE_BUILD_TYPE=Release -DSTRATA_CORE_ONLY=ON \
    -DCMAKE_TOOLCHAIN_FILE="$source_dir/cmake/toolchains/$toolchain.cmake" >/dev/null
  # Two jobs, not one per core plus two: ctest runs another test beside this one.
  cmake --build "$dir" --parallel 2 --target "$@"
}
cross_build "$build_dir" aarch64-linux-gnu-gcc tensor_test model_test model_logits_dump
trees=("$build_dir")
if command -v clang++ >/dev/null; then
  cross_build "$build_dir-clang" aarch64-linux-gnu-clang tensor_test model_logits_dump
  trees+=("$build_dir-clang")
else
  echo "clang++ not installed: the aarch64 tests run on GCC's build only"
fi

# Under emulation only what the architecture changes: the kernels (all of tensor_test, on both
# CPUs, which also shows that the plain path needs no newer instruction), and on max, which has
# every aarch64 path, the paths against each other, the greedy tokens and every weight type
# against the double-precision reference. Threads, chunks and batching run the same code on
# every architecture; the native suite covers them.
"$host_dump" "$build_dir/logits_host.bin"
export QEMU_LD_PREFIX=/usr/aarch64-linux-gnu
# Each CPU model must get its own fastest path (tensor_test's DetectedIsaIsTheOneThisCpuShouldGet
# and the dump's own report): max has the dot-product extension, a Cortex-A53 has not.
for cpu_isa in max:neon-dotprod cortex-a53:neon; do
  cpu=${cpu_isa%%:*}
  export QEMU_CPU=$cpu STRATA_EXPECTED_ISA=${cpu_isa#*:}
  for tree in "${trees[@]}"; do
    echo "== aarch64 ($tree), QEMU_CPU=$cpu, expecting the $STRATA_EXPECTED_ISA path"
    qemu-aarch64 "$tree/tests/tensor/tensor_test" --gtest_brief=1
    if [ "$tree" = "$build_dir" ] && [ "$cpu" = max ]; then
      qemu-aarch64 "$tree/tests/model/model_test" --gtest_brief=1 \
        --gtest_filter='BitExactAcrossIsas.*:ModelVsReference.*:EveryType/SyntheticVsReference.*'
    fi
    report=$(qemu-aarch64 "$tree/tests/model/model_logits_dump" "$tree/logits_$cpu.bin")
    echo "$report"
    grep -q "on the $STRATA_EXPECTED_ISA path" <<<"$report"
    cmp "$build_dir/logits_host.bin" "$tree/logits_$cpu.bin"
    echo "logits on aarch64 ($tree, $cpu, $STRATA_EXPECTED_ISA) equal this machine's byte for byte"
  done
done
