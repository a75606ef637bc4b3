#!/usr/bin/env bash
# The quality comparison of docs/quality.md: one model shape trained three times on the same
# tokens, in the same order, for the same steps – NSA, full (causal dense) attention and the window
# branch alone (`nsa train --attention nsa|full|window`) – then each run's validation loss by
# token position (`nsa eval --by-position`) and one plot of the three (`nsa plot --compare`).
#   bash scripts/quality_run.sh               everything in order (build, data, train, eval, plot)
#   bash scripts/quality_run.sh PHASE [MODE…] one phase: build | data | train [MODES] | eval | plot
# Parameters (environment; defaults in brackets, the docs/quality.md configuration):
#   DEVICE [cuda]  CONFIG [configs/small.yaml]  VOCAB [256: the byte corpus]  SEQ [4096]  W [256]
#   BATCH [8]  STEPS [1000]  LR [2e-3]  MIN_LR [2e-4]  WARMUP [100]  SEED [1337]
#   VAL_EVERY [100]  VAL_BATCHES [4]  CKPT_EVERY [250]
#   DATA [data/corpus_bytes: made here from the default corpus when missing]  RUNS [runs/quality]
#   MODES ["nsa full window"]  EVAL_BATCHES [13]  EVAL_BATCH [8]
#   BUCKETS [W, then 512, 1k, 2k, … above W and below S: edges 0, 256, 512, 1k, 2k, 4096]
#   PARALLEL [0; 1: the runs train side by side on one device, faster in all, slower each]
#   TRAIN_S [0; > 0: stop each run after this many seconds – a later `train` resumes it]
#   OUT [out]: logs, the JSON files, the plots, the metrics and a summary table are copied here.
#   NSA [./build/nsa, built here]: an nsa binary to use instead (no build).
# A run whose folder holds a checkpoint resumes (--resume is bit-exact), so the phases can be
# spread over several calls of a machine lent in short slices; the same steps and data order
# either way.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
device=${DEVICE:-cuda}
config=${CONFIG:-configs/small.yaml}
vocab=${VOCAB:-256}
seq=${SEQ:-4096}
w=${W:-256}
batch=${BATCH:-8}
steps=${STEPS:-1000}
data=${DATA:-data/corpus_bytes}
runs=${RUNS:-runs/quality}
modes=${MODES:-nsa full window}
out=${OUT:-out}
nsa=${NSA:-./build/nsa}
mkdir -p "$out" "$runs"

build() {
  if [ -n "${NSA:-}" ]; then [ -x "$NSA" ] || { echo "NSA=$NSA is not an executable" >&2; return 1; }; return 0; fi
  # shellcheck disable=SC2015
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >"$out/quality_cmake.log" 2>&1 &&
    ninja -C build -j"$(nproc)" nsa >"$out/quality_build.log" 2>&1 ||
    { tail -30 "$out/quality_build.log"; return 1; }
}

# The default corpus as bytes (docs/data.md): from a local copy of the text when there is one
# (shared/data beside or inside the checkout), else fetched with npm.
prepare_data() {
  if ls "$data"/train_*.bin >/dev/null 2>&1; then return 0; fi
  local src
  for src in shared/data ../shared/data; do
    if [ -d "$src/gutenberg" ]; then
      "$nsa" prepare --input "$src" --tokenizer bytes --out "$data" | tail -3
      return "${PIPESTATUS[0]}"
    fi
  done
  "$nsa" prepare --fetch --tokenizer bytes --out "$data" | tail -3
}

# Tokens per run against the training split: the method asks for >= 30M tokens and < 3 passes.
token_budget() {
  local per_run=$((steps * batch * seq)) train_tokens
  train_tokens=$(grep -o '"train_tokens": *[0-9]*' "$data/meta.json" 2>/dev/null | grep -o '[0-9]*$')
  echo "tokens per run: $per_run ($steps steps × $batch × $seq)"
  if [ -n "$train_tokens" ]; then
    echo "training split: $train_tokens tokens; passes per run: $(awk "BEGIN{printf \"%.2f\", $per_run/$train_tokens}")"
    awk "BEGIN{exit !($per_run >= 3 * $train_tokens)}" &&
      echo "WARNING: 3 or more passes over the training split: the comparison would be about overfitting"
  fi
  [ "$per_run" -ge 30000000 ] || echo "WARNING: fewer than 30M tokens per run (docs/quality.md asks for at least 30M)"
}

train_one() {  # $1 = mode; log in $runs/$1.log
  local mode=$1 resume=()
  ls -d "$runs/$mode"/ckpt_* >/dev/null 2>&1 && resume=(--resume)
  local cmd=("$nsa" train --config "$config" --set vocab_size="$vocab" --set seq_len="$seq"
    --set w="$w" --set seed="${SEED:-1337}" --attention "$mode" --data "$data" --device "$device"
    --batch "$batch" --steps "$steps" --lr "${LR:-2e-3}" --min-lr "${MIN_LR:-2e-4}"
    --warmup "${WARMUP:-100}" --val-every "${VAL_EVERY:-100}" --val-batches "${VAL_BATCHES:-4}"
    --ckpt-every "${CKPT_EVERY:-250}" --keep 1 --out "$runs/$mode" "${resume[@]}")
  echo "== train $mode: ${cmd[*]}" | tee -a "$out/quality_commands.txt"
  if [ "${TRAIN_S:-0}" -gt 0 ]; then
    timeout "$TRAIN_S" "${cmd[@]}" >>"$runs/$mode.log" 2>&1 </dev/null
  else
    "${cmd[@]}" >>"$runs/$mode.log" 2>&1 </dev/null
  fi
  local rc=$?
  grep -E '^(attention|trained)' "$runs/$mode.log" | tail -2
  grep -F ' | val ' "$runs/$mode.log" | tail -1 | cut -c1-140
  [ "$rc" -eq 124 ] && echo "$mode: stopped after TRAIN_S = $TRAIN_S s; run 'train $mode' again to resume"
  return "$rc"
}

train_all() {
  token_budget | tee "$out/quality_tokens.txt"
  local mode rc=0
  if [ "${PARALLEL:-0}" = 1 ]; then
    for mode in "$@"; do train_one "$mode" & done
    wait
  else
    for mode in "$@"; do train_one "$mode" || rc=1; done
  fi
  return "$rc"
}

# Bucket edges: w itself (so that "beyond w" is whole buckets), then the powers of two from 512.
default_buckets() {
  local e=512 list=$w
  while [ "$e" -lt "$seq" ]; do
    [ "$e" -gt "$w" ] && list="$list,$e"
    e=$((e * 2))
  done
  echo "$list"
}

evaluate() {
  local mode buckets=(--buckets "${BUCKETS:-$(default_buckets)}")
  for mode in $modes; do
    local cmd=("$nsa" eval --run "$runs/$mode" --data "$data" --device "$device" --by-position
      --batches "${EVAL_BATCHES:-13}" --batch "${EVAL_BATCH:-8}" "${buckets[@]}")
    echo "== eval $mode: ${cmd[*]}" | tee -a "$out/quality_commands.txt"
    "${cmd[@]}" 2>&1 | tee "$out/quality_eval_$mode.txt" || return 1
    cp "$runs/$mode/loss_by_position.json" "$out/quality_loss_by_position_$mode.json"
    cp "$runs/$mode/metrics.jsonl" "$out/quality_metrics_$mode.jsonl" 2>/dev/null
    cp "$runs/$mode.log" "$out/quality_train_$mode.log" 2>/dev/null
  done
}

plot() {
  local dirs=() mode
  for mode in $modes; do dirs+=("$runs/$mode"); done
  echo "== plot: $nsa plot --compare ${dirs[*]} --out $out/quality_loss_by_position.svg" |
    tee -a "$out/quality_commands.txt"
  "$nsa" plot --compare "${dirs[@]}" --out "$out/quality_loss_by_position.svg" || return 1
  summary | tee "$out/quality_summary.md"
}

# The tables of docs/quality.md from the JSON files: validation loss overall and per bucket, the
# buckets that lie beyond w marked.
summary() {
  command -v python3 >/dev/null || { echo "(python3 missing: no summary table)"; return 0; }
  # shellcheck disable=SC2086
  python3 - "$runs" $modes <<'EOF'
import json, sys
runs, modes = sys.argv[1], sys.argv[2:]
rs = {m: json.load(open("%s/%s/loss_by_position.json" % (runs, m))) for m in modes}
first = rs[modes[0]]
w = first["w"]
head = ["%d–%d%s" % (b["begin"], b["end"], " (> w)" if b["begin"] >= w else "")
        for b in first["buckets"]]
print("| attention | step | val loss (all) | " + " | ".join(head) + " |")
print("|---|--:|--:|" + "--:|" * len(head))
for m in modes:
    r = rs[m]
    print("| %s | %d | %.4f | " % (m, r["step"], r["val_loss"]) +
          " | ".join("%.4f" % b["loss"] for b in r["buckets"]) + " |")
beyond = [i for i, b in enumerate(first["buckets"]) if b["begin"] >= w]
if beyond:
    print("\nmean loss over the buckets beyond w = %d (token-weighted):" % w)
    for m in modes:
        bs = [rs[m]["buckets"][i] for i in beyond]
        print("  %-7s %.4f" % (m, sum(b["loss"] * b["tokens"] for b in bs) /
                               sum(b["tokens"] for b in bs)))
EOF
}

phase=${1:-all}
[ $# -gt 0 ] && shift
case $phase in
  all)
    build || exit 1
    prepare_data || exit 1
    # shellcheck disable=SC2086
    train_all $modes || exit 1
    evaluate || exit 1
    plot
    ;;
  build) build ;;
  data) prepare_data && token_budget ;;
  train)
    [ -x "$nsa" ] || build || exit 1
    prepare_data || exit 1
    # shellcheck disable=SC2086
    if [ $# -gt 0 ]; then train_all "$@"; else train_all $modes; fi
    ;;
  eval) evaluate ;;
  plot) plot ;;
  *) echo "quality_run.sh: unknown phase '$phase' (all, build, data, train [MODES], eval, plot)" >&2
     exit 1 ;;
esac
