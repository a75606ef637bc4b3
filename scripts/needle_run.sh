#!/usr/bin/env bash
# The needle experiment of docs/inference.md on a GPU machine, in phases so that training outlives
# one device call (the runs start under setsid and go on while the machine is held):
#   bash scripts/needle_run.sh start      build nsa, start the runs in the background, first steps
#   bash scripts/needle_run.sh watch SEC  wait SEC seconds; each run's progress and a quick check
#   bash scripts/needle_run.sh eval       stop the runs; the retrieval tables (both fillers) to $OUT
#   bash scripts/needle_run.sh all SEC    start, train SEC seconds, save the weights, eval (one call)
# The runs (RUNS, default "nsa win nsa4k"), all `configs/needle_small.yaml` on recall rows – periodic
# copy rows and needles in the random and the cycle filler, taking turns:
#   nsa    all branches, S = 2048, B = 16, 8 needles per needle row
#   win    the same with the window only (--branches win): the ablation
#   nsa4k  all branches, S = 4096, B = 8, 16 needles per needle row
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-out}
runs=${RUNS:-nsa win nsa4k}
dir=runs/needle
mkdir -p "$out" "$dir"

run_args() {  # the training flags of run $1
  local common=(--config configs/needle_small.yaml --device cuda --steps "${STEPS:-12000}"
                --lr "${LR:-1.5e-3}" --min-lr 1e-4 --warmup 200 --val-every 500 --val-batches 4
                --ckpt-every 500 --keep 2 --out "$dir/$1")
  case $1 in
    nsa) echo "${common[@]}" --seq-len 2048 --batch 16 --data copy+needle-random:8+needle:8 ;;
    win) echo "${common[@]}" --seq-len 2048 --batch 16 --data copy+needle-random:8+needle:8 --branches win ;;
    nsa4k) echo "${common[@]}" --seq-len 4096 --batch 8 --data copy+needle-random:16+needle:16 ;;
    # dense recall rows: 32 needles per needle row (7 predictable tokens per question), a third copy rows
    dense) echo "${common[@]}" --seq-len 2048 --batch 16 --data copy+needle-random:32+needle:32 ;;
    densewin) echo "${common[@]}" --seq-len 2048 --batch 16 --data copy+needle-random:32+needle:32 --branches win ;;
    # stage 2: from the copying `nsa` run, on the dense recall rows
    recall) echo "${common[@]}" --seq-len 2048 --batch 16 --data copy+needle-random:32+needle:32 \
                 --init-from "$dir/nsa" --warmup 100 ;;
    *) echo "needle_run.sh: unknown run '$1' (nsa, win, nsa4k, dense, densewin, recall)" >&2; return 1 ;;
  esac
}

save() {  # the newest weights travel back to $OUT: a machine given back loses runs/
  for r in ${SAVE-$runs}; do
    c=$(ls -d "$dir/$r"/ckpt_* 2>/dev/null | tail -1)
    [ -n "$c" ] && mkdir -p "$out/$r" && cp "$c"/COMPLETE "$c"/*.json "$c"/model.safetensors "$out/$r/" 2>/dev/null
  done
}

progress() {
  for r in $runs; do
    echo "== $r: $(grep -cE '^step' "$dir/$r.log" 2>/dev/null) step lines"
    grep -E '^step' "$dir/$r.log" | tail -1 | cut -c1-110
    grep -E 'val' "$dir/$r.log" | tail -3 | cut -c1-110
    grep -iE 'error|watchdog|non-finite' "$dir/$r.log" | head -3
  done
}

phase=${1:-}
if [ "$phase" = all ]; then  # one device call: start, train, then stop and evaluate
  bash "$0" start 30 || exit 1
  sleep "$(( ${2:-300} - 30 ))"
  save
  phase=eval
fi
case $phase in
  start)
    cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >"$out/cmake.log" 2>&1 &&
      ninja -C build -j16 nsa >"$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
    for r in $runs; do
      rm -rf "${dir:?}/$r"
      args=$(run_args "$r") || exit 1
      # shellcheck disable=SC2086
      setsid nohup ./build/nsa train $args >"$dir/$r.log" 2>&1 </dev/null &
    done
    sleep "${2:-60}"
    progress
    nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv
    ;;
  watch)
    sleep "${2:-240}"
    progress
    save
    for r in $runs; do
      [ -d "$dir/$r" ] || continue
      echo "-- $r, random filler, 10 samples"
      timeout 60 ./build/nsa eval --task needle --device cuda --run "$dir/$r" --filler random \
        --seq-lens 2048,8192 --depths 0,0.5,0.9 --samples 10 2>&1 | grep -oE 'needle retrieval of [^ ]*|"seq_len":[0-9]*|"depth":[0-9.]*|"accuracy".*' | paste -sd' ' | sed 's/"seq_len"/\n"seq_len"/g'
    done
    ;;
  eval)
    pkill -f "nsa train" && sleep 3
    progress | tee "$out/needle_progress.txt"
    for r in $runs; do
      for f in cycle random; do
        timeout "${EVAL_S:-120}" ./build/nsa eval --task needle --device cuda --run "$dir/$r" \
          --filler "$f" --samples "${SAMPLES:-20}" --depths 0,0.25,0.5,0.75,1 \
          --seq-lens "${EVAL_LENS:-1024,2048,4096,8192,16384,32768}" 2>&1 | tee -a "$out/needle_eval_$r.txt" |
          grep -v '^{'
      done
    done
    for r in $runs; do cp "$dir/$r/metrics.jsonl" "$out/needle_metrics_$r.jsonl" 2>/dev/null; done
    ls -d "$dir"/*/ckpt_* >>"$out/needle_progress.txt" 2>/dev/null
    ;;
  *)
    echo "usage: bash scripts/needle_run.sh start [SEC]|watch SEC|eval|all SEC" >&2
    exit 2
    ;;
esac
