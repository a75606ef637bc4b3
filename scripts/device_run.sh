#!/usr/bin/env bash
# On a GPU machine: build, run the CUDA tests (and compute-sanitizer on a small case), then the
# attention benchmarks (NSA and dense) – one call, logs to $OUT (or out/). Used with the device tool.
#   bash scripts/device_run.sh [tests|bench|all]
set -uo pipefail
cd "$(dirname "$0")/.."
what=${1:-all}
out=${OUT:-out}
mkdir -p "$out"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >"$out/cmake.log" 2>&1 &&
  ninja -C build -j16 nsa nsa_cuda_tests >"$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
if [ "$what" = tests ] || [ "$what" = all ]; then
  ./build/tests/nsa_cuda_tests 2>&1 | tee "$out/cuda_tests.log" | grep -E "^\[  (PASSED|FAILED)|FAILED|Failure" | head -40
  /usr/local/cuda/bin/compute-sanitizer --tool memcheck --error-exitcode 3 ./build/tests/nsa_cuda_tests \
    --gtest_filter='*h2_batch*:*packed*:*short*' >"$out/sanitizer.log" 2>&1
  echo "compute-sanitizer memcheck rc=$? (0 = clean)"; grep -E "ERROR SUMMARY" "$out/sanitizer.log"
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
  for cfg in m7c_125m paper_attn; do
    ./build/nsa bench attention --device cuda --config "$cfg" --seq-lens "${SEQ_LENS:-2048,4096,8192,16384,32768,65536}" \
      --max-seconds "${MAX_SECONDS:-20}" --json "$out/nsa_$cfg.jsonl" 2>&1 | tee "$out/nsa_$cfg.txt"
    python3 bench/dense_attention.py --config "$cfg" --seq-lens "${SEQ_LENS:-2048,4096,8192,16384,32768,65536}" \
      | tee "$out/dense_$cfg.jsonl"
  done
fi
