#!/usr/bin/env bash
# Builds the core modules (up to the engine) and their tests with clang against libc++, the
# C++ library macOS uses, warnings as errors, and runs the tests there: the core must not lean
# on libstdc++. The rest needs Debian's gRPC and protobuf, built against libstdc++, so only the
# core is checked this way.
# usage: libcxx_test.sh SOURCE_DIR BUILD_DIR CMAKE_GENERATOR
set -euo pipefail
source_dir=$1 build_dir=$2 generator=$3

if ! command -v clang++ >/dev/null || ! echo '#include <version>' | clang++ -stdlib=libc++ -x c++ -E - >/dev/null 2>&1; then
  echo "SKIP libc++: clang++ or libc++ (libc++-14-dev, libc++abi-14-dev) is not installed (scripts/install-deps.sh installs them)"
  exit 0
fi
CC=clang CXX=clang++ cmake -S "$source_dir" -B "$build_dir" -G "$generator" -DCMAKE_BUILD_TYPE=Release \
  -DSTRATA_CORE_ONLY=ON -DCMAKE_CXX_FLAGS=-stdlib=libc++ >/dev/null
tests=(tensor_test model_test tokenizer_test sampling_test engine_test pipeline_test prefix_cache_test admission_test)
# Two jobs, not one per core plus two: ctest runs another test beside this one.
cmake --build "$build_dir" --parallel 2 --target "${tests[@]}"
for t in "${tests[@]}"; do
  binary=$(find "$build_dir/tests" -name "$t" -type f -perm -u+x | head -n 1)
  # Each must really be libc++'s, with no libstdc++ beside it. ldd's output is read whole first:
  # `ldd | grep -q` under pipefail fails at random when grep exits before ldd has written all.
  libraries=$(ldd "$binary") || { echo "ldd cannot read $binary"; exit 1; }
  if ! grep -q 'libc++\.' <<<"$libraries" || grep -q 'libstdc++' <<<"$libraries"; then
    echo "$t is not linked against libc++ alone:"
    echo "$libraries"
    exit 1
  fi
  echo "== $t (libc++)"
  "$binary" --gtest_brief=1
done
echo "the core's tests pass on libc++"
