#!/usr/bin/env bash
# On a machine with two GPUs: data parallelism over NCCL, checked and timed (docs/training.md,
# "Several processes"). Builds nsa, then
#   1. tiny on synthetic data, 12 steps: 2 ranks on 2 GPUs with NCCL (one all-reduce after the
#      backward) against the same 2 ranks summing during it (NSA_GPU_ALLREDUCE=overlap) and through
#      host memory (=host) – the checkpoints must be byte-identical (two fp32 addends: the same
#      sum either way) – and against 1 rank with 2B;
#   2. a rank that exits, and one that stalls, over NCCL: the job must end non-zero within the
#      timeout, naming rank 1; the CUDA trainer tests that start ranks (ZeRO-1 over two ranks through host memory, now on
#      two GPUs, and over NCCL – which skips on one GPU) and the NCCL reducer's;
#   3. m7c_125m on the byte corpus (data/corpus_bytes, carried in), 1 rank against 2 ranks at the
#      same batch per rank, at S = 8192 (the two-rank run 200 steps) and 65,536, the gradients
#      summed after the backward and during it: step times from metrics.jsonl (weak scaling); then
#      ZeRO-1 on two ranks with its weight slices gathered over NCCL (and with Z1_HOST=1 through
#      host memory);
#   4. the outside baseline: the same model with dense attention in PyTorch (bench/
#      dense_model_train.py, cuDNN SDPA) on 1 GPU and with DistributedDataParallel on 2 (torchrun),
#      at the same shapes – whose weak scaling the table beside 3's is.
# QUICK=1 runs 3 (30 steps each, neither the overlap nor ZeRO-1) and 4 only.
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
quick=${QUICK:-0}
if [ "$quick" != 1 ]; then
tiny() {  # name, nproc, batch, extra environment
  env NSA_LAUNCHER=tcp NCCL_DEBUG=INFO $4 ./build/nsa train --device cuda --config configs/tiny.yaml \
    --seq-len 256 --data synthetic --steps 12 --val-every 6 --val-batches 1 --ckpt-every 12 \
    --batch "$3" --nproc "$2" --out "$runs/$1" >"$out/tiny_$1.log" 2>&1
  local rc=$?
  echo "tiny $1 (nproc $2, batch $3 ${4:-}): rc=$rc"
  [ "$rc" -eq 0 ] || status=1
}
tiny nccl 2 2 ""
tiny overlap 2 2 "NSA_GPU_ALLREDUCE=overlap"
tiny host 2 2 "NSA_GPU_ALLREDUCE=host"
tiny one 1 4 ""
grep -E "NCCL INFO (comm|Init COMPLETE|Channel 00/0 : 0\[)" "$out/tiny_nccl.log" | head -6
for other in overlap host; do
  for f in model.safetensors optimizer.safetensors; do
    if cmp "$runs/nccl/ckpt_00000012/$f" "$runs/$other/ckpt_00000012/$f"; then
      echo "nccl vs $other $f: byte-identical"
    else
      status=1
    fi
  done
done
for r in nccl overlap host one; do echo "$r: $(grep '"step":12' "$runs/$r/metrics.jsonl" | head -1 | cut -c1-200)"; done
# Failures over NCCL end the job in bounded time and name the rank (docs/training.md): rank 1
# exits at step 3, or stalls there while rank 0 waits in the all-reduce until its watchdog.
fault() {  # name, flags, the text the output must hold
  local t0=$SECONDS
  timeout 180 env NSA_LAUNCHER=tcp ./build/nsa train --device cuda --config configs/tiny.yaml \
    --seq-len 256 --data synthetic --steps 12 --val-every 0 --ckpt-every 100 --batch 2 --nproc 2 \
    --fault-rank 1 --fault-step 3 $2 --out "$runs/fault_$1" >"$out/fault_$1.log" 2>&1
  local rc=$? took=$((SECONDS - t0))
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && grep -q "$3" "$out/fault_$1.log"; then
    echo "fault $1: exit $rc after ${took} s, names the rank ('$3')"
  else
    echo "fault $1: rc=$rc after ${took} s, expected a non-zero exit (not the timeout) and '$3'"
    grep -vE "NCCL INFO" "$out/fault_$1.log" | tail -5
    status=1
  fi
}
fault dead "--fault exit" "rank 1 exited with status 17"
fault stall "--fault stall --watchdog 10" "rank 1 at step/phase '3 forward+backward'"
./build/tests/nsa_cuda_tests --gtest_filter='CudaTrain.Zero1*:NcclReducer.*' >"$out/tests.log" 2>&1
rc=$?
echo "trainer tests on two GPUs rc=$rc"; [ "$rc" -eq 0 ] || status=1
grep -E "^\[  (PASSED|FAILED)" "$out/tests.log"
fi
if [ -d data/corpus_bytes ]; then
  m7c() {  # name, nproc, seq-len, batch per rank, steps, extra environment, extra flags
    env NSA_LAUNCHER=tcp $6 ./build/nsa train --device cuda --config configs/m7c_125m.yaml \
      --set vocab_size=256 --seq-len "$3" --data data/corpus_bytes --steps "$5" --batch "$4" \
      --val-every 1000 --ckpt-every 1000 --nproc "$2" --out "$runs/m7c_$1" $7 >"$out/m7c_$1.log" 2>&1
    local rc=$?
    echo "m7c $1 (nproc $2, S $3, batch $4 a rank, $5 steps ${6:-} ${7:-}): rc=$rc"
    [ "$rc" -eq 0 ] || status=1
    python3 - "$runs/m7c_$1/metrics.jsonl" "$1" <<'PY'
import json, math, sys, statistics
rows = [json.loads(l) for l in open(sys.argv[1]) if '"step"' in l]
ms = [r["step_ms"] for r in rows if r.get("step", 0) > 10 and r.get("step_ms")]
toks = [r["tokens_per_s"] for r in rows if r.get("step", 0) > 10 and r.get("tokens_per_s")]
losses = [r["loss"] for r in rows if "loss" in r]
print(f"  {sys.argv[2]}: steps 11-{rows[-1].get('step')} median step "
      f"{statistics.median(ms) if ms else 'n/a'} ms, median tok/s "
      f"{statistics.median(toks) if toks else 'n/a'}; loss {losses[0] if losses else 'n/a'} -> "
      f"{losses[-1] if losses else 'n/a'}, all finite: {all(isinstance(x, (int, float)) and math.isfinite(x) for x in losses)}")
PY
  }
  # Weak scaling at S = 8192 (4 sequences a rank) and 65,536 (1); the two-rank 8k run is the clean
  # 200-step run.
  # The two-rank runs sum after the backward (the default) and during it (overlap).
  m7c s8k_1 1 8192 4 30 "" ""
  m7c s8k_2 2 8192 4 "$([ "$quick" = 1 ] && echo 30 || echo 200)" "" ""
  [ "$quick" = 1 ] || m7c s8k_2overlap 2 8192 4 30 "NSA_GPU_ALLREDUCE=overlap" ""
  m7c s64k_1 1 65536 1 30 "" ""
  m7c s64k_2 2 65536 1 30 "" ""
  [ "$quick" = 1 ] || m7c s64k_2overlap 2 65536 1 30 "NSA_GPU_ALLREDUCE=overlap" ""
  # ZeRO-1 on two GPUs, its weight slices gathered over NCCL (through host memory: Z1_HOST=1).
  [ "$quick" = 1 ] || m7c z8k_nccl 2 8192 4 30 "" "--zero1"
  [ "${Z1_HOST:-0}" = 1 ] && m7c z8k_host 2 8192 4 30 "NSA_GPU_ALLREDUCE=host" "--zero1"
fi
# The outside baseline: dense attention in PyTorch, 1 GPU and DDP on 2, the same shapes and
# batches a rank as 3 (32,768 tokens a rank at S = 8192, one sequence at 65,536).
if python3 -c "import torch" 2>/dev/null; then
  for S in 8192 65536; do
    for n in 1 2; do
      python3 -m torch.distributed.run --standalone --nproc_per_node "$n" \
        bench/dense_model_train.py --seq-lens "$S" --tokens-per-step 32768 --steps 10 \
        >"$out/ddp_${S}_$n.log" 2>&1
      rc=$?
      echo "pytorch dense S $S on $n GPU(s): rc=$rc $(grep '"bench"' "$out/ddp_${S}_$n.log")"
      [ "$rc" -eq 0 ] || status=1
    done
  done
fi
exit "$status"
