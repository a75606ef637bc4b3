#!/usr/bin/env bash
# On a machine with two GPUs: data parallelism over NCCL, checked and timed (docs/training.md,
# "Several processes"). Builds nsa, then
#   1. tiny on synthetic data, 12 steps: 2 ranks on 2 GPUs with NCCL against the same 2 ranks
#      summing through host memory (NSA_GPU_ALLREDUCE=host) – the checkpoints must be byte-
#      identical (two fp32 addends: the same sum either way) – and against 1 rank with 2B;
#   2. the CUDA trainer tests that start ranks (ZeRO-1 over two ranks, now on two GPUs);
#   3. m7c_125m on the byte corpus (data/corpus_bytes, carried in), 1 rank against 2 ranks at the
#      same batch per rank: step times from metrics.jsonl (weak scaling).
# Logs to $OUT (default out/). Exits non-zero if a run fails, the checkpoints differ or a test
# fails (the timings are reported, not checked).
set -uo pipefail
status=0
out=${OUT:-out}
mkdir -p "$out"
nvidia-smi -L | tee "$out/gpus.txt"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >"$out/cmake.log" 2>&1 &&
  ninja -C build -j"$(nproc)" nsa nsa_cuda_tests >"$out/build.log" 2>&1 ||
  { tail -20 "$out/build.log"; exit 1; }
runs=/tmp/two_gpu
rm -rf "$runs"
tiny() {  # name, nproc, batch, extra environment
  env NSA_LAUNCHER=tcp NCCL_DEBUG=INFO $4 ./build/nsa train --device cuda --config configs/tiny.yaml \
    --seq-len 256 --data synthetic --steps 12 --val-every 6 --val-batches 1 --ckpt-every 12 \
    --batch "$3" --nproc "$2" --out "$runs/$1" >"$out/tiny_$1.log" 2>&1
  local rc=$?
  echo "tiny $1 (nproc $2, batch $3 ${4:-}): rc=$rc"
  [ "$rc" -eq 0 ] || status=1
}
tiny nccl 2 2 ""
tiny host 2 2 "NSA_GPU_ALLREDUCE=host"
tiny one 1 4 ""
grep -E "NCCL INFO (comm|Init COMPLETE|Channel 00/0 : 0\[)" "$out/tiny_nccl.log" | head -6
for f in model.safetensors optimizer.safetensors; do
  if cmp "$runs/nccl/ckpt_00000012/$f" "$runs/host/ckpt_00000012/$f"; then
    echo "nccl vs host $f: byte-identical"
  else
    status=1
  fi
done
for r in nccl host one; do echo "$r: $(grep '"step":12' "$runs/$r/metrics.jsonl" | head -1 | cut -c1-200)"; done
./build/tests/nsa_cuda_tests --gtest_filter='CudaTrain.Zero1*:NcclReducer.*' >"$out/tests.log" 2>&1
rc=$?
echo "trainer tests on two GPUs rc=$rc"; [ "$rc" -eq 0 ] || status=1
grep -E "^\[  (PASSED|FAILED)" "$out/tests.log"
if [ -d data/corpus_bytes ]; then
  m7c() {  # nproc
    NSA_LAUNCHER=tcp ./build/nsa train --device cuda --config configs/m7c_125m.yaml --set vocab_size=256 \
      --seq-len 8192 --data data/corpus_bytes --steps 30 --batch 4 --val-every 1000 --ckpt-every 1000 \
      --nproc "$1" --out "$runs/m7c_$1" >"$out/m7c_$1.log" 2>&1
    local rc=$?
    echo "m7c nproc $1: rc=$rc"
    [ "$rc" -eq 0 ] || status=1
    python3 - "$runs/m7c_$1/metrics.jsonl" "$1" <<'PY'
import json, sys, statistics
rows = [json.loads(l) for l in open(sys.argv[1]) if '"step"' in l]
ms = [r.get("step_ms") for r in rows if r.get("step", 0) > 10]
ms = [m for m in ms if m]
toks = [r.get("tokens_per_s") for r in rows if r.get("step", 0) > 10 and r.get("tokens_per_s")]
print(f"  nproc {sys.argv[2]}: steps 11-30 median step {statistics.median(ms) if ms else 'n/a'} ms,"
      f" median tok/s {statistics.median(toks) if toks else 'n/a'}; last row: {json.dumps(rows[-1])[:300]}")
PY
  }
  m7c 1
  m7c 2
fi
exit "$status"
