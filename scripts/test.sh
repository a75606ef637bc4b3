#!/usr/bin/env bash
# Runs every test: installs dependencies, builds (with CUDA when the toolkit is present; GPU tests
# then skip explicitly without a GPU), runs CTest, then builds the CPU code again under
# AddressSanitizer + UndefinedBehaviorSanitizer and runs the CPU tests there.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)

bash scripts/install_deps.sh --python

echo "== clang-format =="
if git rev-parse --git-dir >/dev/null 2>&1; then
  git ls-files -- '*.h' '*.cpp' '*.cu' '*.cuh'
else
  find include src apps tests bench -name '*.h' -o -name '*.cpp' -o -name '*.cu' -o -name '*.cuh'
fi | xargs clang-format --dry-run --Werror

echo "== build (Release) =="
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DNSA_CUDA=AUTO
cmake --build build -j "$jobs"
echo "== tests =="
ctest --test-dir build --output-on-failure -j "$jobs"

echo "== build (ASan + UBSan, CPU only) =="
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DNSA_CUDA=OFF -DNSA_SANITIZE=ON
cmake --build build-asan -j "$jobs"
echo "== tests under sanitizers =="
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build-asan --output-on-failure -j "$jobs" -L cpu
