#!/usr/bin/env bash
# The needle experiment of docs/inference.md#the-needle-task on one GPU: `configs/needle_small.yaml`
# trained in eleven stages on recall rows (periodic copy rows and needle rows in the random and the
# cycle filler, taking turns), a window-only ablation of the first stage, and the retrieval tables
# of every run in both fillers.
#   bash scripts/needle_run.sh recipe        everything in order (on an H100 the eleven stages
#                                            train in about 34 minutes without the ablation: the
#                                            first seven 18.5, 2026-11-27, the four 64k stages
#                                            after edge64 15.4, 2026-11-28, by the logged clocks)
#   bash scripts/needle_run.sh run NAME      one run in the foreground (after a build)
# For machines lent in short slices, the same runs in phases (a run starts under setsid and goes on
# between calls while the machine is held; its --init-from run must be there):
#   bash scripts/needle_run.sh start [SEC]   build nsa, start RUNS in the background, SEC s of steps
#   bash scripts/needle_run.sh watch SEC     wait SEC seconds; progress; newest weights to $OUT
#   bash scripts/needle_run.sh save          the newest weights of RUNS to $OUT
#   bash scripts/needle_run.sh eval          stop the runs; the retrieval tables of RUNS to $OUT
#   bash scripts/needle_run.sh all SEC       start, train SEC seconds, save the weights, eval
#   bash scripts/needle_run.sh recipe-start [SEC]   build, then the recipe's stages one after
#                                            another in the background; SEC s later, progress
#   bash scripts/needle_run.sh recipe-wait SEC      wait until the recipe's training ends (at
#                                            most SEC s), then progress
#   (then `SAVE_RUNS=edge64z RUNS=edge64z … save` and `PROBE=1 RUNS=edge64z … eval`)
# SAMPLES (eval, default 20), EVAL_LENS, EVAL_S (eval, default 120 s for each run and filler):
# the GPU evaluation builds its model once per length (it built one per sample chunk until the
# eighteenth session, when one filler at 64k with 100 samples per cell ran past 60 s).
# ABLATION=0 (recipe, recipe-start): without the window-only run short-win.
# SAVE_RUNS (watch, save, all): the runs whose newest weights go to $OUT (default RUNS; $OUT takes
# eight files back, three a run).
# PROBE=1 (eval, recipe): the retrieval tables with `nsa eval --probe` – per layer, whether the
# selection held the needle where the answer starts (docs/quality.md, "Why a needle is missed").
# N_SEL=N (eval): the same weights with N selected blocks (`nsa eval --n-sel`, docs/quality.md).
# The runs (RUNS, default "short short-win"; each stage starts from the previous one's weights):
#   short      S = 2048,  B = 16, 32 needles per needle row, 12,000 steps from scratch; rows 0, 3, …,
#              15 of every batch copy rows, the others needle rows in the two fillers by turns
#              (FIRST_ROWS=stream: a third of each kind over the stream instead)
#   short-win  the same with the window only (--branches win): the ablation
#   mid        S = 8192,  B = 4,  64 needles per row,  5,000 steps from short; rows 0 and 3 copy
#   long       S = 16384, B = 3,  64 needles per row,  6,000 steps from mid
#   far        S = 16384, B = 3,  16 needles per row (farther apart), 6,500 steps from long
#   edge16     S = 16384, B = 5,  adds single-needle rows (a quarter at depth 0, a quarter at 1),
#              4,000 steps from far
#   edge32     edge16's rows at S = 32768, B = 5, 1,500 steps from edge16
#   edge64     edge16's rows at S = 65536, B = 2, 1,800 steps from edge32
#   edge64s    S = 65536, B = 2, 1,800 steps from edge64, single-needle rows only (both fillers by
#              turns): needles far back
#   edge64x    1,800 steps from edge64s: single-needle rows and rows that start with a whole
#              needle task of a random length (needle-short: the short lengths' layouts, a needle
#              at position 0 asked a few thousand tokens later) by turns
#   edge64y    1,800 steps from edge64x, two short-task rows to one single-needle row
#   edge64z    2,400 steps from edge64y, three to one: the final model (>= 0.99 in every cell,
#              4k to 64k, both fillers; docs/quality.md)
# Measured side branches (docs/inference.md), not part of the recipe:
#   far32      S = 32768, B = 3,  16 needles per row, 900 steps from far
#   edge       edge16's rows at S = 32768, 1,500 steps from far
#   edge16r    a sixth of the rows more in the random filler, 3,000 steps from edge16
#   edge64m    edge64's rows, 1,800 more steps from edge64 at lr 5e-5 → 5e-6
#   polish16   edge64's rows at S = 16384, 1,000 steps from edge64, lr 3e-5 → 3e-6
#   polish32   the same at S = 32768, 500 steps
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
out=${OUT:-out}
runs=${RUNS:-short short-win}
dir=runs/needle
mkdir -p "$out" "$dir"

run_args() {  # the training flags of run $1
  local common=(--config configs/needle_small.yaml --device cuda --val-every 500 --ckpt-every 500
                --keep 2 --out "$dir/$1")
  # short's and mid's rows as before the stream turn (279d211) – kind r mod 3 at row r of every
  # batch: short 6 copy rows of 16, mid 2 of 4 – spelt as a turn as long as the batch, which the
  # stream turn then draws row for row. The documented edge16 (2026-11-25) was trained so, and the
  # recipe retrieves far better so than with a third of each kind (FIRST_ROWS=stream; measured
  # 2026-11-27, docs/quality.md "The first stages' rows").
  local short_rows mid_rows
  short_rows=$(printf 'copy+needle-random:32+needle:32+%.0s' 1 2 3 4 5)copy
  mid_rows=copy+needle-random:64+needle:64+copy
  if [ "${FIRST_ROWS:-batch}" = stream ]; then
    short_rows=copy+needle-random:32+needle:32
    mid_rows=copy+needle-random:64+needle:64
  fi
  local short=(--seq-len 2048 --batch 16 --data "$short_rows" --steps 12000
               --lr 1.5e-3 --min-lr 1e-4 --warmup 200 --val-batches 4)
  late() {  # the stages after far: S B steps rows lr min-lr from
    echo "${common[@]}" --seq-len "$1" --batch "$2" --steps "$3" --data "$4" --lr "$5" --min-lr "$6" \
      --warmup 50 --val-batches 1 --init-from "$dir/$7"
  }
  local edge=copy+needle:16+needle-random:16+needle+needle-random  # + single-needle rows
  case $1 in
    short) echo "${common[@]}" "${short[@]}" ;;
    short-win) echo "${common[@]}" "${short[@]}" --branches win ;;
    mid) echo "${common[@]}" --seq-len 8192 --batch 4 --data "$mid_rows" \
           --steps 5000 --lr 1e-3 --min-lr 1e-4 --warmup 100 --val-batches 4 --init-from "$dir/short" ;;
    long) echo "${common[@]}" --seq-len 16384 --batch 3 --data copy+needle-random:64+needle:64 \
            --steps 6000 --lr 7e-4 --min-lr 1e-4 --warmup 100 --val-batches 2 --init-from "$dir/mid" ;;
    far) echo "${common[@]}" --seq-len 16384 --batch 3 --data copy+needle-random:16+needle:16 \
           --steps 6500 --lr 5e-4 --min-lr 5e-5 --warmup 100 --val-batches 2 --init-from "$dir/long" ;;
    far32) late 32768 3 900 copy+needle-random:16+needle:16 3e-4 3e-5 far ;;
    edge) late 32768 5 1500 "$edge" 3e-4 3e-5 far ;;
    edge16) late 16384 5 4000 "$edge" 3e-4 3e-5 far ;;
    edge32) late 32768 5 1500 "$edge" 2e-4 2e-5 edge16 ;;
    edge64) late 65536 2 1800 "$edge" 1e-4 1e-5 edge32 ;;
    edge64m) late 65536 2 1800 "$edge" 5e-5 5e-6 edge64 ;;
    edge64s) late 65536 2 1800 needle+needle-random 5e-5 5e-6 edge64 ;;
    edge64x) late 65536 2 1800 needle-short+needle-random-short+needle+needle-random 5e-5 5e-6 edge64s ;;
    edge64y) late 65536 2 1800 needle-short+needle-random-short+needle-short+needle-random-short+needle+needle-random \
               3e-5 3e-6 edge64x ;;
    edge64z) late 65536 2 2400 needle-short+needle-random-short+needle-short+needle-random-short+needle-short+needle-random-short+needle+needle-random \
               3e-5 3e-6 edge64y ;;
    polish16 | polish32)  # a short stage at 16k or 32k after edge64
      local s=16384 n=1000
      [ "$1" = polish32 ] && s=32768 n=500
      echo "${common[@]}" --seq-len "$s" --batch 5 --steps "$n" --data "$edge" --lr 3e-5 \
        --min-lr 3e-6 --warmup 20 --val-batches 1 --init-from "$dir/edge64" ;;
    edge16r) late 16384 6 3000 copy+needle:16+needle-random:16+needle+needle-random:16+needle-random \
               2e-4 2e-5 edge16 ;;
    *) echo "needle_run.sh: unknown run '$1' (short, short-win, mid, long, far, edge16, edge32, edge64, edge64s, edge64x, edge64y, edge64z; far32, edge, edge16r, edge64m, polish16, polish32)" >&2
       return 1 ;;
  esac
}

build() {
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >"$out/cmake.log" 2>&1 &&
    ninja -C build -j16 nsa >"$out/build.log" 2>&1 || { tail -30 "$out/build.log"; return 1; }
}

train() {  # run $1 in the foreground, its log in runs/needle/$1.log
  local args
  rm -rf "${dir:?}/$1"
  args=$(run_args "$1") || return 1
  # shellcheck disable=SC2086
  ./build/nsa train $args >"$dir/$1.log" 2>&1 </dev/null
}

save() {  # the newest weights travel back to $OUT: a machine given back loses runs/
  for r in ${SAVE_RUNS:-$runs}; do
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

evaluate() {  # the retrieval tables of the runs $@, both fillers
  for r in "$@"; do
    for f in cycle random; do
      timeout "${EVAL_S:-120}" ./build/nsa eval --task needle --device cuda --run "$dir/$r" \
        --filler "$f" --samples "${SAMPLES:-20}" --depths 0,0.25,0.5,0.75,1 \
        --seq-lens "${EVAL_LENS:-4096,16384,32768,65536}" ${PROBE:+--probe} ${N_SEL:+--n-sel "$N_SEL"} 2>&1 |
        tee -a "$out/needle_eval_$r.txt" |
        grep -v '^{'
    done
    cp "$dir/$r/metrics.jsonl" "$out/needle_metrics_$r.jsonl" 2>/dev/null
  done
}

stages="mid long far edge16 edge32 edge64 edge64s edge64x edge64y edge64z"  # after short, each from the one before
recipe_runs="short $stages"
[ "${ABLATION:-1}" = 1 ] && recipe_runs="short short-win $stages"
phase=${1:-}
if [ "$phase" = all ]; then  # one device call: start, train, then stop and evaluate
  bash "$0" start 30 || exit 1
  sleep "$((${2:-300} - 30))"
  save
  phase="eval"
fi
case $phase in
  recipe)
    build || exit 1
    bash "$0" recipe-train || exit 1
    runs="$recipe_runs" progress | tee "$out/needle_progress.txt"
    # shellcheck disable=SC2086
    evaluate $recipe_runs
    ;;
  recipe-train)  # the stages (and the ablation beside the first), nsa built
    if [ "${ABLATION:-1}" = 1 ]; then train short & train short-win & wait; else train short; fi
    for r in $stages; do train "$r" || { tail -5 "$dir/$r.log"; exit 1; }; done
    ;;
  recipe-start)
    build || exit 1
    setsid nohup bash "$0" recipe-train >"$dir/recipe.log" 2>&1 </dev/null &
    echo $! >"$dir/recipe.pid"
    sleep "${2:-60}"
    runs="$recipe_runs" progress
    ;;
  recipe-wait)  # by the pid recipe-start wrote (a pgrep for the script's name finds its caller too)
    pid=$(cat "$dir/recipe.pid" 2>/dev/null) || { echo "needle_run.sh: no recipe started here" >&2; exit 1; }
    end=$((SECONDS + ${2:-540}))
    while kill -0 "$pid" 2>/dev/null && [ "$SECONDS" -lt "$end" ]; do sleep 5; done
    kill -0 "$pid" 2>/dev/null && echo "the recipe's training still runs"
    runs="$recipe_runs" progress
    ;;
  run)  # one run in the foreground (nsa built)
    train "${2:?run name}"
    ;;
  start)
    build || exit 1
    for r in $runs; do  # setsid: the runs outlive the call that started them
      setsid nohup bash "$0" run "$r" >/dev/null 2>&1 </dev/null &
    done
    sleep "${2:-60}"
    progress
    ;;
  save)
    save
    ;;
  watch)
    sleep "${2:-240}"
    progress
    save
    ;;
  eval)
    # Anchored: the runs only, not a shell whose command line names them.
    pkill -f "^./build/nsa train --config configs/needle_small" && sleep 3
    progress | tee "$out/needle_progress.txt"
    # shellcheck disable=SC2086
    evaluate $runs
    ;;
  *)
    echo "usage: bash scripts/needle_run.sh recipe|recipe-start [SEC]|recipe-wait SEC|run NAME|start [SEC]|watch SEC|save|eval|all SEC" >&2
    exit 2
    ;;
esac
