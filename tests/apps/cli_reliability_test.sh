#!/usr/bin/env bash
# End-to-end reliability of the CLI (issue 25): nothing a user types or a disk does crashes a run
# or loses work. Each check is one defect that must not come back: a full disk mid-checkpoint,
# runs that collide in one folder, damaged or hostile checkpoints, non-finite inputs, sizes that
# overflow, out-of-range flags. Every bad input exits 1 with one line naming it – never a crash.
# Usage: cli_reliability_test.sh NSA_BINARY WORK_DIR
set -u
nsa=$1
dir=$2
cfg="$(dirname "$0")/../../configs/tiny.yaml"
rm -rf "$dir" && mkdir -p "$dir"
source "$(dirname "$0")/cli_checks.sh"
train_base() { "$nsa" train --config "$cfg" --set dim=32 --set n_layers=1 --data synthetic --batch 2 \
  --watchdog 0 "$@"; }
train() { train_base --seq-len 48 --val-every 0 "$@"; }

# 1. A full disk while the second checkpoint is written: the run fails, the first checkpoint stays
# complete (--keep 1 must not prune it), the broken one does not count, and --resume continues.
for file in state.json COMPLETE model.safetensors; do
  NSA_TEST_FAIL_WRITE=$file:2 expect_error "disk full at $file" "$file.*failed" \
    train --steps 2 --ckpt-every 1 --keep 1 --out "$dir/full"
  check "disk full at $file: previous checkpoint kept" test -f "$dir/full/ckpt_00000001/COMPLETE"
  check "disk full at $file: no broken checkpoint" test ! -e "$dir/full/ckpt_00000002"
  expect_ok "disk full at $file: resume" train --steps 2 --ckpt-every 1 --keep 1 --out "$dir/full" --resume
  check "disk full at $file: resumed to the end" test -f "$dir/full/ckpt_00000002/COMPLETE"
  # 6. The resumed run's metrics hold step 2 once.
  check "disk full at $file: metrics once per step" \
    test "$(grep -c '"step":' "$dir/full/metrics.jsonl")" -eq 2
  rm -rf "$dir/full"
done

# 2. A fresh run into an existing run folder is refused (nothing touched), or replaced on request.
expect_ok "first run" train --steps 1 --out "$dir/run"
cp "$dir/run/metrics.jsonl" "$dir/metrics_before.jsonl"
expect_error "fresh run into an old run" "pass --resume to continue it, a new --out" \
  train --steps 2 --out "$dir/run"
check "old metrics untouched" cmp -s "$dir/run/metrics.jsonl" "$dir/metrics_before.jsonl"
expect_ok "--overwrite" train --steps 2 --out "$dir/run" --overwrite
check "--overwrite: a new run" test "$(grep -c '"step":' "$dir/run/metrics.jsonl")" -eq 2
echo x >"$dir/a_file"
expect_error "--out is a file" "exists and is not a folder" train --steps 1 --out "$dir/a_file"

# 3. Two runs into one folder at once: the second names the first's pid.
"$nsa" train --config "$cfg" --set dim=32 --set n_layers=1 --data synthetic --batch 2 --seq-len 48 \
  --val-every 0 --steps 100000 --out "$dir/busy" >/dev/null 2>&1 &
holder=$!
for _ in $(seq 300); do [ -s "$dir/busy/run.lock" ] && break; sleep 0.1; done
expect_error "second writer" "in use by another nsa train (pid $holder)" \
  train --steps 1 --out "$dir/busy" --resume
kill "$holder"; wait "$holder" 2>/dev/null
expect_ok "lock released when its holder dies" train --steps 1 --out "$dir/busy" --resume

# 4, 11. A checkpoint is input: a missing one, or a state.json with a field out of range.
expect_error "missing checkpoint" "checkpoint '$dir/nope' does not exist" \
  "$nsa" eval --checkpoint "$dir/nope" --data synthetic
cp -r "$dir/run" "$dir/hostile"
sed -i 's/"train_position": [0-9]*/"train_position": -1/' "$dir/hostile/ckpt_00000002/state.json"
expect_error "negative train_position" "hostile/ckpt_00000002/state.json': field 'train_position' = -1" \
  train --steps 3 --out "$dir/hostile" --resume

# 8, 9. Sizes are bounded before anything is allocated: an error, never an abort or a hang.
"$nsa" attention --write-example "$dir/in.safetensors" --seq-len 64 >/dev/null 2>&1
expect_error "--w 1e10" "w = 10000000000 must be at most 2147483647" \
  "$nsa" attention --in "$dir/in.safetensors" --out "$dir/o.safetensors" --w 10000000000
expect_error "--l-sel 2^40" "l_sel = 1099511627776 must be at most" \
  "$nsa" attention --in "$dir/in.safetensors" --out "$dir/o.safetensors" --l-sel 1099511627776
expect_error "--n-sel 1e12" "n_sel = 1000000000000 must be at most" \
  "$nsa" attention --in "$dir/in.safetensors" --out "$dir/o.safetensors" --n-sel 1000000000000
expect_error "--n-sel too big for memory" "sel_idx .* needs .* GiB, limit" \
  env NSA_MEMORY_LIMIT_GIB=1 "$nsa" attention --in "$dir/in.safetensors" --out "$dir/o.safetensors" --n-sel 2000000000
expect_ok "--w beyond the sequence" \
  "$nsa" attention --in "$dir/in.safetensors" --out "$dir/o.safetensors" --w 2147483647 --l-sel 1073741824
expect_error "vocab_size 2^62" "vocab_size = 4611686018427387904 must be at most" \
  train --steps 1 --set vocab_size=4611686018427387904 --out "$dir/big"
expect_error "n_layers 1e8" "n_layers = 100000000 must be at most" \
  train --steps 1 --set n_layers=100000000 --out "$dir/big"
expect_error "weights too big for memory" "fp32 weights .* needs .* GiB, limit" \
  env NSA_MEMORY_LIMIT_GIB=1 "$nsa" train --config "$cfg" --set n_layers=4096 --set dim=4096 --out "$dir/big"
expect_error "--seq-len 1e12" "seq-len = 1000000000000 must be in" \
  train_base --steps 1 --seq-len 1000000000000 --out "$dir/big"
expect_error "write-example --seq-len 2^62" "seq-len = 4611686018427387904 must be in" \
  "$nsa" attention --write-example "$dir/big.safetensors" --seq-len 4611686018427387904
check "no example written" test ! -e "$dir/big.safetensors"
printf '\x4a\x00\x00\x00\x00\x00\x00\x00{"x":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}}' >"$dir/overflow.safetensors"
expect_error "inspect: element count overflows" "overflows a 64-bit byte count" "$nsa" inspect "$dir/overflow.safetensors"
# inspect on odd but valid contents: a tensor of NaNs only, an empty one, a newline in metadata.
odd='{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"e":{"dtype":"F32","shape":[0],"data_offsets":[8,8]},"__metadata__":{"note":"line1\nline2"}}'
{ printf "$(printf '\\x%02x' ${#odd})\x00\x00\x00\x00\x00\x00\x00"; printf '%s' "$odd"
  printf '\x00\x00\xc0\x7f\x00\x00\xc0\x7f'; } >"$dir/odd.safetensors"
expect_ok "inspect: NaNs only, empty, a newline in metadata" "$nsa" inspect "$dir/odd.safetensors"
check "inspect: NaNs only say so" grep -q "no finite values  NON-FINITE: 2" "$dir/out.txt"
check "inspect: empty says so" grep -q "\[0\] *empty" "$dir/out.txt"
check "inspect: metadata on one line" grep -q 'line1\\nline2' "$dir/out.txt"

# 10. Out-of-range flags name the flag and the allowed range.
expect_error "--seq-len -7" "seq-len = -7 must be in \[0, " train_base --steps 1 --seq-len -7 --out "$dir/bad"
expect_error "--val-batches 0" "val-batches = 0 must be in \[1, " train_base --steps 1 --val-every 1 --val-batches 0 --out "$dir/bad"
expect_error "--val-batches -3" "val-batches = -3" train --steps 1 --val-batches -3 --out "$dir/bad"
expect_error "--lr -1" "lr = -1 must be a finite number >= 0" train --steps 1 --lr -1 --out "$dir/bad"
expect_error "--branches ''" "branches is empty" train --steps 1 --branches '' --out "$dir/bad"
expect_error "--recompute all" "--recompute 'all': use none, ops or layers" \
  train --steps 1 --recompute all --out "$dir/bad"
expect_ok "--recompute ops on the CPU (it keeps everything)" train --steps 1 --recompute ops --out "$dir/cpu_ops"
expect_error "eval --seq-len -5" "seq-len = -5 must be in" \
  "$nsa" eval --run "$dir/run" --data synthetic --seq-len -5
expect_error "eval --batches -1" "batches = -1 must be in" \
  "$nsa" eval --run "$dir/run" --data synthetic --batches -1
check "nothing trained by refused runs" test ! -e "$dir/bad/metrics.jsonl"

# 5. Non-finite inputs are refused, naming the tensor (NaN in q: 0x7fc00000 at its first float).
python3 - "$dir/in.safetensors" "$dir/nan.safetensors" <<'PY' 2>/dev/null
import json, struct, sys
b = open(sys.argv[1], "rb").read(); n = struct.unpack("<Q", b[:8])[0]
start = 8 + n + json.loads(b[8:8 + n])["q"]["data_offsets"][0]
open(sys.argv[2], "wb").write(b[:start] + struct.pack("<f", float("nan")) + b[start + 4:])
PY
if [ -f "$dir/nan.safetensors" ]; then
  expect_error "NaN input" "tensor 'q' in .* holds nan at flat index 0" \
    "$nsa" attention --in "$dir/nan.safetensors" --out "$dir/o.safetensors"
else
  echo "skip NaN input (no python3)"
fi

# 11. Folders where files belong; --write-example with --in/--out; the summary without validation.
mkdir -p "$dir/a_folder"
expect_error "folder as input" "is a folder" "$nsa" attention --in "$dir/a_folder" --out "$dir/o.safetensors"
expect_error "folder as --out" "is a folder" "$nsa" attention --in "$dir/in.safetensors" --out "$dir/a_folder"
check "no temporary left behind" test ! -e "$dir/a_folder.tmp"
expect_error "--write-example with --in" "drop --in/--out" \
  "$nsa" attention --write-example "$dir/ex.safetensors" --in "$dir/in.safetensors"
expect_ok "summary without validation" train --steps 1 --out "$dir/noval"
check "summary says no validation" grep -q "loss .*, no validation ->" "$dir/out.txt"

# 12. What a probe of the CLI found (the thirty-second session): each once lost work or data, or
# accepted input it then mishandled.
# --overwrite clears the old run only once the new run's inputs are checked; a folder of the
# user's named ckpt_* survives it; --init-from inside the --out it would clear is refused.
expect_ok "a run to keep" train --steps 1 --out "$dir/keep"
mkdir -p "$dir/keep/ckpt_notes"
expect_error "--overwrite with a bad --init-from" "is neither a complete checkpoint" \
  train --steps 1 --out "$dir/keep" --overwrite --init-from "$dir/nope"
expect_error "--overwrite with missing --data" "nope" \
  "$nsa" train --config "$cfg" --set dim=32 --set n_layers=1 --data "$dir/nope" --batch 2 \
  --seq-len 48 --steps 1 --out "$dir/keep" --overwrite
check "the refused --overwrite kept the old run" test -f "$dir/keep/ckpt_00000001/COMPLETE"
expect_error "--init-from inside the --out that --overwrite clears" "lies in --out" \
  train --steps 1 --out "$dir/keep" --overwrite --init-from "$dir/keep"
check "... and kept it too" test -f "$dir/keep/ckpt_00000001/COMPLETE"
expect_ok "--overwrite" train --steps 1 --out "$dir/keep" --overwrite
check "--overwrite left the user's ckpt_notes" test -d "$dir/keep/ckpt_notes"
# A negative seed (its checkpoint could not be read back); a changed field on resume is named.
expect_error "--set seed=-1" "seed = -1 must be in" train --steps 1 --set seed=-1 --out "$dir/bad"
expect_error "resume with another w" "w = .* there, 32 here" \
  train --steps 2 --out "$dir/keep" --resume --set w=32
# --resume with nothing to resume says it starts over.
expect_ok "--resume into an empty folder" train --steps 1 --out "$dir/fresh" --resume
check "... says it starts at step 1" grep -q "holds no complete checkpoint; starting at step 1" "$dir/out.txt"
# --min-lr above --lr is refused; without --min-lr it follows a lowered --lr.
expect_error "--min-lr above --lr" "min-lr = 0.5 must be at most --lr = 0.001" \
  train --steps 1 --lr 1e-3 --min-lr 0.5 --out "$dir/bad"
expect_ok "--lr below the default --min-lr" train --steps 1 --lr 1e-5 --out "$dir/low_lr"
# A diverging run stops at its first non-finite gradient; its metrics stay JSON and plot.
expect_error "diverging run" "non-finite" train --steps 4 --lr 1e30 --clip 0 --out "$dir/diverge"
check "diverged metrics hold no nan or inf (JSON has none)" \
  test "$(grep -Eic '[:,[](-?nan|-?inf)' "$dir/diverge/metrics.jsonl")" -eq 0
expect_ok "plot a diverged run" "$nsa" plot "$dir/diverge"
# Output paths: --in as --out, an empty --out, a file as prepare's --out.
expect_error "attention --out = --in" "is the --in file" \
  "$nsa" attention --in "$dir/in.safetensors" --out "$dir/in.safetensors"
expect_error "train --out ''" "--out is empty" train --steps 1 --out ''
echo x >"$dir/a_file"
expect_error "prepare --out a file" "exists and is not a folder" \
  "$nsa" prepare --input "$cfg" --tokenizer bytes --out "$dir/a_file"
# prepare again into the same folder: the earlier preparation's extra shards go.
printf 'one two three four five six seven eight nine ten\n%.0s' $(seq 200) >"$dir/text.txt"
expect_ok "prepare, small shards" "$nsa" prepare --input "$dir/text.txt" --tokenizer bytes \
  --shard-tokens 1000 --out "$dir/prep"
expect_ok "prepare again, one shard" "$nsa" prepare --input "$dir/text.txt" --tokenizer bytes --out "$dir/prep"
check "... says what it removed" grep -q "removed .* file(s) of an earlier preparation" "$dir/out.txt"
check "... leaves one train shard" test "$(ls "$dir/prep" | grep -c '^train_')" -eq 1
# eval counts no token twice: --batches past the split's distinct batches is capped, and said.
expect_ok "eval --batches past the split" "$nsa" eval --run "$dir/keep" --data "$dir/prep" \
  --batches 100 --batch 1 --seq-len 48
check "... capped to the split's distinct batches" grep -q "batches 100 capped to it" "$dir/out.txt"
# A checkpoint with a vocabulary past bytes needs --sp-model; a run folder is not a checkpoint.
expect_ok "a 512-token model" train --steps 1 --set vocab_size=512 --out "$dir/v512"
expect_error "generate without --sp-model" "pass --sp-model" \
  "$nsa" generate --run "$dir/v512" --prompt hi --max-new 2
expect_error "eval --checkpoint on a run folder" "is a run folder, not a checkpoint: pass --run" \
  "$nsa" eval --checkpoint "$dir/keep" --data synthetic
# A config that sets a field twice or lacks one without a default; prepare flags that bytes ignore;
# a resume with nothing left to train.
{ cat "$cfg"; echo "n_sel: 4"; } >"$dir/twice.yaml"
expect_error "a field twice in a config" "field 'n_sel' appears twice" \
  "$nsa" train --config "$dir/twice.yaml" --data synthetic --steps 1 --out "$dir/bad"
grep -v '^vocab_size:' "$cfg" >"$dir/lacking.yaml"
expect_error "a config without vocab_size" "lacks the field 'vocab_size'" \
  "$nsa" train --config "$dir/lacking.yaml" --data synthetic --steps 1 --out "$dir/bad"
expect_error "prepare --vocab-size with bytes" "vocab-size applies to --tokenizer sentencepiece" \
  "$nsa" prepare --input "$dir/text.txt" --tokenizer bytes --vocab-size 1000 --out "$dir/prep"
expect_ok "--resume past --steps" train --steps 1 --out "$dir/keep" --resume
check "... says there is nothing to train" grep -q "nothing to train: .* is at step 1" "$dir/out.txt"
# Non-finite numbers in generate and bench.
expect_error "generate --temperature inf" "temperature = inf must be a finite number >= 0" \
  "$nsa" generate --run "$dir/keep" --prompt hi --temperature inf
expect_error "bench --max-seconds nan" "max-seconds = nan must be a finite number >= 0 (0: never stop" \
  "$nsa" bench attention --device cpu --max-seconds nan
# diagnose: unknown backends and branches are errors, not rows of "pass".
expect_error "diagnose --backends tpu" "'tpu' is not one of: cpu, cuda" \
  "$nsa" diagnose --configs tiny --seq-lens 50 --backends tpu
expect_error "diagnose --branches foo" "'foo' in 'foo' is not one of: cmp, sel, win" \
  "$nsa" diagnose --configs tiny --seq-lens 50 --backends cpu --branches foo

# 13. The rest of that probe (the thirty-third session): a run refused after it locked a new --out
# leaves no folder; --zero1 on one rank says it does nothing; an input given twice, or inside
# another input, is refused (its documents were counted twice); SentencePiece's own error for a
# vocabulary the text cannot fill says which flag to change, and prepare then removes the --out it
# created.
expect_error "a new --out, missing --data" "nope" \
  "$nsa" train --config "$cfg" --set dim=32 --set n_layers=1 --data "$dir/nope" --batch 2 \
  --seq-len 48 --steps 1 --out "$dir/new_refused"
check "... leaves no folder behind" test ! -e "$dir/new_refused"
expect_ok "--zero1 on one rank" train --steps 1 --zero1 --out "$dir/zero1"
check "... says it shards only over several ranks" grep -q "zero1: one rank holds all" "$dir/out.txt"
expect_error "--input twice" "is given twice" \
  "$nsa" prepare --input "$dir/text.txt" --input "$dir/./text.txt" --tokenizer bytes --out "$dir/bad"
mkdir -p "$dir/texts" && cp "$dir/text.txt" "$dir/texts/a.txt"
expect_error "--input inside another --input" "overlap (one lies in the other)" \
  "$nsa" prepare --input "$dir/texts" --input "$dir/texts/a.txt" --tokenizer bytes --out "$dir/bad"
expect_error "a vocabulary the text cannot fill" "too large for it.*pass a smaller --vocab-size" \
  "$nsa" prepare --input "$dir/text.txt" --tokenizer sentencepiece --vocab-size 5000 --out "$dir/sp"
check "... and leaves no --out it created" test ! -e "$dir/sp"

finish reliability
