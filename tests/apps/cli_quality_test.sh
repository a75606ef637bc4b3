#!/usr/bin/env bash
# The quality comparison's commands end to end (docs/quality.md): `nsa train --attention
# nsa|full|window` (and the config field), `nsa eval --by-position` (JSON + SVG), `nsa plot
# --compare`, generation from a full-attention run, and one clear error per bad flag.
# Usage: cli_quality_test.sh NSA_BINARY WORK_DIR
set -u
nsa=$1
dir=$2
cfg="$(dirname "$0")/../../configs/tiny.yaml"
rm -rf "$dir" && mkdir -p "$dir"
source "$(dirname "$0")/cli_checks.sh"
train() { "$nsa" train --config "$cfg" --set dim=32 --set n_layers=1 --set w=16 --data synthetic \
  --batch 2 --set seq_len=96 --steps 4 --val-every 2 --val-batches 1 --watchdog 0 "$@"; }

# 1. The three attentions train; each checkpoint records its attention; the console says which.
for mode in nsa full window; do
  expect_ok "train --attention $mode" train --attention "$mode" --out "$dir/$mode"
  check "$mode: the console names the attention" grep -q "^attention: $mode" "$dir/out.txt"
  check "$mode: recorded in the checkpoint" \
    grep -q "\"attention\": \"$mode\"" "$dir/$mode/ckpt_00000004/state.json"
done
printf 'attention: window\n' >"$dir/window.yaml"
grep -v '^#' "$cfg" >>"$dir/window.yaml"
expect_ok "attention from the config file" "$nsa" train --config "$dir/window.yaml" --set dim=32 \
  --set n_layers=1 --data synthetic --batch 2 --seq-len 64 --steps 1 --val-every 0 --out "$dir/yaml"
check "config file: recorded" grep -q '"attention": "window"' "$dir/yaml/ckpt_00000001/state.json"
expect_error "bad --attention" "--attention 'dense' is not one of: nsa, full, window" \
  train --attention dense --out "$dir/bad"
expect_error "bad attention in --set" "attention = 'dense' is not one of" \
  train --set attention=dense --out "$dir/bad"
expect_error "--attention window with --branches" "cannot be combined with branches = 'sel,win'" \
  train --attention window --branches sel,win --out "$dir/bad"
expect_error "resume with another attention" "different model config" \
  train --attention full --out "$dir/window" --resume

# 2. eval --by-position: JSON and SVG in the run folder (or --out), buckets cover every position.
expect_ok "eval --by-position" "$nsa" eval --run "$dir/full" --data synthetic --batches 2 \
  --batch 2 --by-position --buckets 0,16,48
check "by-position: JSON written" test -f "$dir/full/loss_by_position.json"
check "by-position: SVG written" grep -q "<polyline" "$dir/full/loss_by_position.svg"
check "by-position: the format" grep -q '"format": "nsa-loss-by-position"' "$dir/full/loss_by_position.json"
check "by-position: the attention" grep -q '"attention": "full"' "$dir/full/loss_by_position.json"
check "by-position: buckets 0-16-48-96" bash -c "tr -d ' \n' <'$dir/full/loss_by_position.json' |
  grep -q '\"begin\":0,\"end\":16,.*\"begin\":16,\"end\":48,.*\"begin\":48,\"end\":96,'"
for mode in nsa window; do
  expect_ok "eval --by-position $mode" "$nsa" eval --run "$dir/$mode" --data synthetic \
    --batches 2 --batch 2 --by-position --buckets 16,48
done
expect_ok "eval --by-position --out" "$nsa" eval --checkpoint "$dir/nsa/ckpt_00000004/" \
  --data synthetic --batches 1 --batch 2 --by-position --out "$dir/elsewhere/nsa_lbp.json"
check "--out: JSON and SVG there" test -f "$dir/elsewhere/nsa_lbp.json" -a -f "$dir/elsewhere/nsa_lbp.svg"
expect_error "--buckets not increasing" "--buckets: the edges must be strictly increasing" \
  "$nsa" eval --run "$dir/nsa" --data synthetic --by-position --buckets 0,50,20
expect_error "--buckets beyond S" "--buckets: edge 500 is outside \[0, 96\]" \
  "$nsa" eval --run "$dir/nsa" --data synthetic --by-position --buckets 500
expect_error "--buckets without --by-position" "--buckets and --out belong to --by-position" \
  "$nsa" eval --run "$dir/nsa" --data synthetic --buckets 16
expect_error "--by-position with --task needle" "cannot be combined with --task needle" \
  "$nsa" eval --run "$dir/nsa" --task needle --by-position
expect_error "--out not .json" "must name a .json file" \
  "$nsa" eval --run "$dir/nsa" --data synthetic --by-position --out "$dir/x.svg"
expect_error "--by-position without --data" "--data is required" \
  "$nsa" eval --run "$dir/nsa" --by-position

# 3. plot --compare: one curve per run, and the training curves beside it.
expect_ok "plot --compare" "$nsa" plot --compare "$dir/nsa" "$dir/full" "$dir/window/" \
  --out "$dir/cmp/quality.svg"
check "compare: three curves" test "$(grep -c '<polyline' "$dir/cmp/quality.svg")" -eq 3
check "compare: labelled by run" grep -q ">full<" "$dir/cmp/quality.svg"
check "compare: training curves" test -f "$dir/cmp/quality_curves.svg"
expect_ok "plot --compare with a JSON file" "$nsa" plot --compare "$dir/elsewhere/nsa_lbp.json" \
  "$dir/full/loss_by_position.json" --out "$dir/cmp/files.svg"
check "compare files: no curves without metrics" grep -q "no loss curves" "$dir/out.txt"
expect_error "plot --compare: a run without the file" "has no loss_by_position.json" \
  "$nsa" plot --compare "$dir/nsa" "$dir/yaml" --out "$dir/cmp/x.svg"
expect_error "plot --compare: a missing path" "neither a run folder nor a loss-by-position file" \
  "$nsa" plot --compare "$dir/nsa" "$dir/nothing" --out "$dir/cmp/x.svg"
expect_error "plot --out not .svg" "must name a .svg file" \
  "$nsa" plot --compare "$dir/nsa" --out "$dir/cmp/x.png"
expect_error "plot --out without --compare" "--out belongs to --compare" \
  "$nsa" plot "$dir/nsa" --out "$dir/cmp/x.svg"
expect_error "plot: nothing named" "name a run folder" "$nsa" plot
expect_ok "plot one run still works" "$nsa" plot "$dir/nsa"

# 4. A full-attention run generates (its decoder window covers the prompt and the new tokens).
expect_ok "generate from a full-attention run" "$nsa" generate --run "$dir/full" --prompt "ab" \
  --max-new 8 --temperature 0

finish quality
