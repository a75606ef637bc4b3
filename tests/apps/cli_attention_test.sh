#!/usr/bin/env bash
# End-to-end test of the CLI (attention, inspect, prepare, train, eval, plot, generate): each
# command works on small inputs, and each kind of bad input exits non-zero with one line naming it.
# Usage: cli_attention_test.sh NSA_BINARY WORK_DIR
set -u
nsa=$1
dir=$2
rm -rf "$dir" && mkdir -p "$dir"
source "$(dirname "$0")/cli_checks.sh"

expect_ok "write example" "$nsa" attention --write-example "$dir/in.safetensors" --seq-len 200 --batch 2
expect_ok "run attention" "$nsa" attention --in "$dir/in.safetensors" --out "$dir/out.safetensors"
expect_ok "inspect output" "$nsa" inspect "$dir/out.safetensors"
for name in o o_cmp o_sel o_win sel_idx lse_cmp dq dk_cmp dv_cmp dk_sel dv_sel dk_win dv_win dg_cmp dg_sel dg_win; do
  if grep -q "^  $name " "$dir/out.txt"; then pass "output has $name"; else fail "output has $name"; fi
done
grep -q "sel_idx *I32 *\[2,200,2,4\]" "$dir/out.txt" && pass "sel_idx shape" || fail "sel_idx shape"
expect_ok "mlp + shared example" "$nsa" attention --write-example "$dir/mlp.safetensors" --phi mlp --kv shared --seq-len 70
expect_ok "mlp + shared run" "$nsa" attention --in "$dir/mlp.safetensors" --out "$dir/mlp_out.safetensors" --n-sel 5
expect_ok "inspect mlp output" "$nsa" inspect "$dir/mlp_out.safetensors"
grep -q "dphi_k_w1" "$dir/out.txt" && pass "mlp output has dphi_k_w1" || fail "mlp output has dphi_k_w1"

expect_error "missing input file" "cannot open safetensors file '$dir/nope.safetensors'" \
  "$nsa" attention --in "$dir/nope.safetensors" --out "$dir/x.safetensors"
head -c 100 "$dir/in.safetensors" >"$dir/truncated.safetensors"
expect_error "truncated file" "truncated" \
  "$nsa" attention --in "$dir/truncated.safetensors" --out "$dir/x.safetensors"
printf 'garbage that is not a safetensors file' >"$dir/garbage.safetensors"
expect_error "corrupt header" "garbage.safetensors" \
  "$nsa" attention --in "$dir/garbage.safetensors" --out "$dir/x.safetensors"
expect_error "bad override" "l = 10 must be a multiple of d = 8" \
  "$nsa" attention --in "$dir/in.safetensors" --out "$dir/x.safetensors" --l 10
expect_error "shared kv on separate file" "has no tensor 'k'" \
  "$nsa" attention --in "$dir/in.safetensors" --out "$dir/x.safetensors" --kv shared
expect_error "shape flag with --in" "is read from the tensor shapes" \
  "$nsa" attention --in "$dir/in.safetensors" --out "$dir/x.safetensors" --heads 8
expect_error "bad example config" "heads = 6 must be a multiple of groups = 4" \
  "$nsa" attention --write-example "$dir/bad.safetensors" --heads 6 --groups 4
if nvidia-smi -L >/dev/null 2>&1; then
  expect_ok "cuda run" "$nsa" attention --in "$dir/in.safetensors" --out "$dir/cuda_out.safetensors" --device cuda
else
  expect_error "cuda without a GPU" "CUDA" \
    "$nsa" attention --in "$dir/in.safetensors" --out "$dir/x.safetensors" --device cuda
fi
[ ! -e "$dir/x.safetensors" ] && pass "no output written on error" || fail "no output written on error"

# nsa prepare on a small file (real text when ../shared/data is beside the checkout).
alice="$(dirname "$0")/../../../shared/data/gutenberg/carroll-alice.txt"
[ -f "$alice" ] || { printf 'Some text.\nMore text.\n' >"$dir/small.txt"; alice="$dir/small.txt"; }
expect_ok "prepare bytes" "$nsa" prepare --input "$alice" --out "$dir/prep" --tokenizer bytes
[ -f "$dir/prep/train_000000.bin" ] && [ -f "$dir/prep/meta.json" ] && pass "prepare wrote shards" || fail "prepare wrote shards"
expect_error "prepare missing input" "input '$dir/nope.txt' does not exist" \
  "$nsa" prepare --input "$dir/nope.txt" --out "$dir/prep2"
expect_error "prepare nothing" "nothing to prepare" "$nsa" prepare --out "$dir/prep3"

expect_ok "diagnose" "$nsa" diagnose --configs tiny --seq-lens 50,131 --backends cpu,cuda
grep -q "0 failure(s)" "$dir/out.txt" && pass "diagnose table" || fail "diagnose table"
expect_ok "diagnose model" "$nsa" diagnose --model "$(dirname "$0")/../../configs/tiny.yaml" --layers 1,2 \
  --seq-lens 70 --branches "cmp,sel,win;win" --backends cpu,cuda
grep -q "0 failure(s)" "$dir/out.txt" && grep -q "^2 .* win .*cpu *pass" "$dir/out.txt" &&
  pass "diagnose model table" || fail "diagnose model table"
# needle: train a few steps on the task, then the retrieval table.
expect_ok "train needle" "$nsa" train --config "$(dirname "$0")/../../configs/tiny.yaml" --data needle \
  --steps 2 --batch 2 --seq-len 96 --val-every 0 --out "$dir/needle"
expect_ok "eval needle" "$nsa" eval --task needle --run "$dir/needle" --seq-lens 96 --depths 0,1 --samples 2
grep -q '"task":"needle","filler":"cycle","seq_len":96,"depth":1.0000,"samples":2' "$dir/out.txt" &&
  pass "needle table" || fail "needle table"
# --probe: depth 0 puts the needle in the forced block 0, so every layer selects it in every group.
expect_ok "eval needle probe" "$nsa" eval --task needle --run "$dir/needle" --seq-lens 160 --depths 0 \
  --samples 2 --probe
grep -q '"depth":0.0000,.*"selected_any":\[2,2\],"selected_all":\[2,2\]' "$dir/out.txt" &&
  grep -q "^probe at the query's last key token" "$dir/out.txt" &&
  grep -q "^the selected branch's gate per head there" "$dir/out.txt" &&
  grep -q '"head_gates":\[\[\[0\.[0-9]*,0\.[0-9]*,0\.[0-9]*\],' "$dir/out.txt" &&
  grep -q "^the needle's value tokens' weight in each head's output there" "$dir/out.txt" &&
  grep -q "^the needle's blocks' (those of its value tokens) weight" "$dir/out.txt" &&
  grep -q '"needle_block_weight":\[\[' "$dir/out.txt" &&
  grep -q '"needle_mass":\[\[\[[01]\.[0-9]*,[01]\.[0-9]*,0\.0000\],' "$dir/out.txt" &&
  pass "needle probe" || fail "needle probe"
# Each task's options are refused with the other; the needle arguments are checked before any cell.
expect_error "eval needle with a loss flag" "--batch belongs to the loss evaluation" \
  "$nsa" eval --task needle --run "$dir/needle" --batch 2
expect_error "eval loss with a needle flag" "--samples belongs to --task needle" \
  "$nsa" eval --run "$dir/needle" --data synthetic --samples 2
expect_error "eval loss with --probe" "--probe belongs to --task needle" \
  "$nsa" eval --run "$dir/needle" --data synthetic --probe
expect_error "eval needle depth" "--depths: 2 is outside \[0, 1\]" \
  "$nsa" eval --task needle --run "$dir/needle" --seq-lens 96 --depths 0,2
# --n-sel: the same weights with more selected blocks – at 160 tokens (5 blocks of 32) 8 hold every
# block, so every layer selects the needle at depth 0.5 in every group; fewer than 3 is refused.
expect_ok "eval needle n-sel" "$nsa" eval --task needle --run "$dir/needle" --seq-lens 160 --depths 0.5 \
  --samples 2 --probe --n-sel 8
grep -q "2 samples per cell, n_sel 8; accuracy" "$dir/out.txt" &&
  grep -q '"depth":0.5000,.*"selected_any":\[2,2\],"selected_all":\[2,2\]' "$dir/out.txt" &&
  pass "needle n-sel" || fail "needle n-sel"
expect_error "eval needle n-sel below the forced blocks" "--n-sel = 2 must be at least 3" \
  "$nsa" eval --task needle --run "$dir/needle" --seq-lens 96 --n-sel 2
expect_error "eval loss with --n-sel" "--n-sel belongs to --task needle" \
  "$nsa" eval --run "$dir/needle" --data synthetic --n-sel 8
expect_ok "train needle-short" "$nsa" train --config "$(dirname "$0")/../../configs/tiny.yaml" \
  --data needle-short+needle-random-short --steps 1 --batch 2 --seq-len 1100 --val-every 0 \
  --out "$dir/needle_short"
expect_ok "train needle-mix" "$nsa" train --config "$(dirname "$0")/../../configs/tiny.yaml" \
  --data needle-mix:2 --steps 1 --batch 2 --seq-len 96 --val-every 0 --out "$dir/needle_mix"
expect_ok "train copy from a checkpoint" "$nsa" train --config "$(dirname "$0")/../../configs/tiny.yaml" \
  --data copy --init-from "$dir/needle" --steps 1 --batch 2 --seq-len 64 --val-every 0 --out "$dir/copy"
grep -q "initialised from .*needle/ckpt_00000002" "$dir/out.txt" && pass "init-from names the checkpoint" ||
  fail "init-from names the checkpoint"
expect_error "init-from another shape" "was written for a different model config" \
  "$nsa" train --config "$(dirname "$0")/../../configs/tiny.yaml" --set dim=32 --data copy \
  --init-from "$dir/needle" --steps 1 --batch 2 --seq-len 64 --out "$dir/copy_bad"
expect_ok "train repeat" "$nsa" train --config "$(dirname "$0")/../../configs/tiny.yaml" --data repeat \
  --steps 1 --batch 2 --seq-len 64 --val-every 0 --out "$dir/repeat"
expect_error "bad needle count" "needle:N, needle-random:N and needle-mix:N take N needles per sequence, 1 to 64" \
  "$nsa" train --config "$(dirname "$0")/../../configs/tiny.yaml" --data needle:0 --out "$dir/bad_needle"

# train → eval → plot → generate, end to end on a few synthetic steps.
expect_ok "train synthetic" "$nsa" train --config "$(dirname "$0")/../../configs/tiny.yaml" --data synthetic \
  --steps 3 --batch 2 --seq-len 64 --val-every 3 --val-batches 1 --out "$dir/run"
[ -f "$dir/run/ckpt_00000003/COMPLETE" ] && [ -f "$dir/run/loss.svg" ] && pass "checkpoint and plot" || fail "checkpoint and plot"
expect_ok "eval" "$nsa" eval --run "$dir/run" --data synthetic --batches 1 --batch 2 --seq-len 64
expect_ok "plot" "$nsa" plot "$dir/run"
expect_ok "generate" "$nsa" generate --run "$dir/run" --prompt "Once" --max-new 8 --seed 1
# --samples N decodes N continuations as one batch; sample i uses seed + i, as a lone run would.
"$nsa" generate --run "$dir/run" --prompt "Once" --max-new 8 --seed 5 >"$dir/gen_one.txt" 2>/dev/null
"$nsa" generate --run "$dir/run" --prompt "Once" --max-new 8 --seed 4 --samples 2 >"$dir/gen_two.txt" 2>/dev/null
sed -n '/^--- sample 1 (seed 5) ---$/,$p' "$dir/gen_two.txt" | tail -n +2 >"$dir/gen_two_1.txt"
[ "$(cat "$dir/gen_one.txt")" = "$(cat "$dir/gen_two_1.txt")" ] && [ -s "$dir/gen_one.txt" ] &&
  pass "generate --samples: sample i is the seed + i run" || fail "generate --samples: sample i is the seed + i run"
# --prompt-file: the same continuation as --prompt with that text (greedy), the prompt not echoed,
# a final line with the prefill time and decode tok/s; clear errors for bad files.
printf 'Once upon a time, in a land far away, there lived' >"$dir/prompt.txt"
"$nsa" generate --run "$dir/run" --prompt "$(cat "$dir/prompt.txt")" --max-new 12 --temperature 0 \
  >"$dir/gen_text.txt" 2>/dev/null
"$nsa" generate --run "$dir/run" --prompt-file "$dir/prompt.txt" --max-new 12 --temperature 0 \
  >"$dir/gen_file.txt" 2>"$dir/gen_file_err.txt"
[ -s "$dir/gen_file.txt" ] && [ "$(cat "$dir/prompt.txt")$(cat "$dir/gen_file.txt")" = "$(cat "$dir/gen_text.txt")" ] &&
  pass "generate --prompt-file continues as --prompt" || fail "generate --prompt-file continues as --prompt"
grep -q "prefill 49 tokens in .* tok/s.*decode .* tok/s" "$dir/gen_file_err.txt" &&
  pass "generate: final line with prefill time and tok/s" ||
  fail "generate: final line with prefill time and tok/s ($(tail -1 "$dir/gen_file_err.txt"))"
expect_error "prompt file missing" "--prompt-file '$dir/nothing.txt' does not exist" \
  "$nsa" generate --run "$dir/run" --prompt-file "$dir/nothing.txt"
: >"$dir/empty.txt"
expect_error "prompt file empty" "is empty" "$nsa" generate --run "$dir/run" --prompt-file "$dir/empty.txt"
printf '\0\0' >"$dir/nul.txt"
expect_error "prompt file without tokens" "encodes to no tokens" \
  "$nsa" generate --run "$dir/run" --prompt-file "$dir/nul.txt"
expect_error "prompt file too long for the context" "exceed --max-context 40" \
  "$nsa" generate --run "$dir/run" --prompt-file "$dir/prompt.txt" --max-new 8 --max-context 40
truncate -s 1100M "$dir/huge.txt"  # sparse: no disk used
expect_error "prompt file too large" "prompts up to 1073741824 bytes" \
  "$nsa" generate --run "$dir/run" --prompt-file "$dir/huge.txt"
rm -f "$dir/huge.txt"
expect_error "generate --max-new -1" "--max-new: Value -1 not in range" \
  "$nsa" generate --run "$dir/run" --prompt "x" --max-new -1
expect_error "diagnose --layers without --model" "--layers requires --model" "$nsa" diagnose --layers 2
expect_error "prompt and prompt file" "excludes" \
  "$nsa" generate --run "$dir/run" --prompt "x" --prompt-file "$dir/prompt.txt"
expect_error "bench decode --prefill spec" "--prefill: '4096y16' is not LENxCOUNT" \
  "$nsa" bench decode --prefill 4096y16
# Benchmark lengths and counts are checked before anything runs (--steps 0 crashed the CPU one).
expect_error "bench decode --steps 0" "--steps: Value 0 not in range" "$nsa" bench decode --steps 0
expect_error "bench decode cpu with a cuda flag" "--device cpu: --batches belongs to --device cuda" \
  "$nsa" bench decode --batches 1,16 --contexts 64 --steps 1
expect_error "bench decode cpu with --trace" "--device cpu: --trace belongs to --device cuda" \
  "$nsa" bench decode --trace --contexts 64 --steps 1
expect_error "bench decode cuda with --config" "--device cuda: --config belongs to --device cpu" \
  "$nsa" bench decode --device cuda --config tiny
expect_error "bench decode --contexts" "--contexts: Value -5 not in range" \
  "$nsa" bench decode --contexts 1024,-5
expect_error "bench attention --seq-lens 0" "--seq-lens: Value 0 not in range" \
  "$nsa" bench attention --seq-lens 0
expect_error "bench train --tokens-per-step 0" "--tokens-per-step: Value 0 not in range" \
  "$nsa" bench train --tokens-per-step 0
expect_error "bench decode --json unwritable" "cannot write --json file '/nonexistent/x.jsonl'" \
  "$nsa" bench decode --json /nonexistent/x.jsonl --contexts 64 --steps 1
if nvidia-smi -L >/dev/null 2>&1; then
  expect_ok "generate cuda" "$nsa" generate --run "$dir/run" --prompt "Once" --max-new 8 --device cuda
  expect_ok "generate cuda --prompt-file" "$nsa" generate --run "$dir/run" --prompt-file "$dir/prompt.txt" \
    --max-new 8 --device cuda --samples 3
else
  expect_error "generate cuda without a GPU" "CUDA" \
    "$nsa" generate --run "$dir/run" --prompt "Once" --max-new 8 --device cuda
  # The GPU benchmarks stop before their PyTorch baselines and table headers ("no usable CUDA
  # device", or in a build without CUDA "this build has no CUDA backend").
  expect_error "bench train without a GPU" "nsa bench train --device cuda: \(no usable\|this build\)" \
    "$nsa" bench train --python /nonexistent/python
  expect_error "bench decode without a GPU" "nsa bench decode --device cuda: \(no usable\|this build\)" \
    "$nsa" bench decode --device cuda --python /nonexistent/python
  grep -q "dense baseline\|context" "$dir/out.txt" && fail "bench decode printed before the device check" ||
    pass "bench decode printed nothing before the device check"
fi
expect_error "eval without checkpoint" "has no complete checkpoint" "$nsa" eval --run "$dir/nothing" --data synthetic
expect_error "bad config override" "n_sel = 2 must be at least 3" \
  "$nsa" train --config "$(dirname "$0")/../../configs/tiny.yaml" --set n_sel=2 --out "$dir/bad"

finish CLI
