#!/usr/bin/env bash
# On a GPU machine: build, run the CUDA tests (and compute-sanitizer on a small case), then the
# attention benchmarks (NSA and dense) – one call, logs to $OUT (or out/). Used with the device tool.
#   bash scripts/device_run.sh [tests|bench|workshop|compare|final|model|decode|decode-compare|decode-trace|decode-kernels|decode-tile|decode-loads|decode-select|decode-hotspots|copy|pytorch|pytorch-compare|hotspots|all]
# `compare` (not in `all`): the attention benchmark of this tree and of the build BASE (a commit,
# default HEAD~1) in the same call, the dense baseline, and Nsight Compute's per-kernel times of
# one forward + backward (NCU_SHAPES, config:S pairs; of both builds unless NCU_BASE=0).
# `final`: tests, then compare (BASE builds in the background meanwhile).
# RACE_FILTER (tests, final, all): also compute-sanitizer racecheck on these CUDA tests (a gtest
# filter, e.g. '*h16_paper*:*d192*'); memcheck always runs on '*h2_batch*:*packed*:*short*'.
# BASE_DIR (compare, final, workshop): build the base from this source tree instead of BASE – for
# commits the device's copy of the repository does not have (made after the session began): run
# `git archive HEAD | tar -x -C prev_tree` here before the call (prev_tree is then carried as an
# untracked folder) and pass BASE_DIR=prev_tree. `workshop` with BASE or BASE_DIR set times the
# base build's kernels too, in the same call, before this tree's.
# `model` (also in `all`): the GPU model's tests, `nsa bench train` (keeping everything, with the
# dense PyTorch baseline bench/dense_model_train.py run first in the same process's call; then with
# each --recompute policy of TRAIN_RECOMPUTE, default "ops layers"), and 200 steps of m7c_125m on
# real text (byte shards in data/corpus_bytes, made by `nsa prepare --tokenizer bytes`), straight
# and as 100 + resume 100, whose final weights must be identical.
# `decode` (also in `all`): the GPU decoding and prefill tests, compute-sanitizer on the prefill and
# on the decode layer (memcheck; racecheck on its smallest case),
# and `nsa bench decode --device cuda` (its dense column the faster of ours and PyTorch SDPA,
# bench/dense_decode.py run in the same call; then the batched prefill), with DECODE_FLAGS (default
# --distinct-layers: every layer's attention reads caches of its own, as in the model's step; set
# DECODE_FLAGS= for one layer's caches called n_layers times, the benchmark's own default).
# `pytorch` (not in `all`): the Python package on the GPU – python/tests (the CUDA ones must run:
# NSA_REQUIRE_CUDA=1 makes a skip a failure) with build/libnsa_capi.so, then bench/pytorch_op.py
# (the op's forward + backward from PyTorch against `nsa bench attention` and SDPA, at
# PYTORCH_SEQ_LENS, default 16384, for m7c_125m and paper_attn). pytest if the image has it, else
# python/tests/mini_pytest.py runs test_cuda.py.
# `pytorch-compare` (not in `all`): the Python tests as `pytorch`, then bench/pytorch_op.py with the
# build BASE (or BASE_DIR: its nsa and libnsa_capi.so; this tree's Python package) and with this
# tree alternately, ROUNDS times (default 2), at PYTORCH_CONFIGS (default m7c_125m) and
# PYTORCH_SEQ_LENS (default 16384): the op's overhead of both builds measured in one call.
# `decode-compare` (not in `all`): the decode tests and compute-sanitizer on the decode layer (as
# `decode`), then `nsa bench decode --device cuda --prefill none` of the build BASE (or BASE_DIR)
# and of this tree alternately, ROUNDS times (default 2; PyTorch SDPA in the first run only), at
# DECODE_CONTEXTS (default 65536,131072) and DECODE_BATCHES (default 1,16): attention-only and
# whole-step ms of both builds measured in one call. DECODE_FLAGS: more flags of every run, default
# --distinct-layers (the attention alone with caches of its own per layer, SDPA's likewise; since
# the forty-first session – before, one layer's caches called n_layers times: set DECODE_FLAGS=).
# MORE_DIRS (decode-compare): further source trees (space-separated, each made as BASE_DIR is),
# built beside the base and benchmarked between it and this tree in every round – one call that
# measures a chain of changes one by one.
# `decode-tile` (not in `all`): nsa_decode_tile – a decode part's attention (tile_attend) timed
# alone in one CTA, cycles and ns a call at 128, 64 and 16 keys, then 3,168 CTAs at once (ns a
# part across the GPU: batch 16's regime) (DECODE_TILE_ARGS: its options, default --ctas 3168).
# `decode-loads` (not in `all`): nsa_decode_loads – a part's cache rows brought into shared
# memory by cp.async and by TMA boxes, N CTAs at once (DECODE_LOADS_ARGS, default
# --ctas 74,148,264,1216 --groups 2; --groups 1: contiguous rows).
# `decode-select` (not in `all`): nsa_decode_select – the picks kernel's merge of the top-n chunks'
# lists (select_blocks) timed alone in one CTA, cycles per phase at 64k and 128k, the selection
# checked against the exact top-n (DECODE_SELECT_ARGS: its options); then Nsight Compute's source
# lines where its warp waits, at 64k.
# `decode-hotspots` (not in `all`): Nsight Compute on the decode kernels of NCU_KERNELS (default
# "parts topk picks"), each alone at DECODE_CONTEXT (default 65536), B = DECODE_BATCH (default 1):
# duration, occupancy and throughputs, warp instructions and stall cycles per instruction, then
# the source lines where the warps wait
# (NCU_SAMPLING: the sampling interval, 0 .. 31 or auto – 0 for the few warps of a B = 1 kernel).
# `decode-trace` (not in `all`): `nsa bench decode --device cuda --trace` at DECODE_CONTEXTS and
# DECODE_BATCHES (as decode-compare), no SDPA, no prefill: the attention kernels' phase timestamps
# (first / median / last CTA per phase, µs from the step's inputs being ready) of the attention
# alone and inside the model's step, also as JSON lines in $OUT/decode_trace.jsonl.
# `decode-kernels` (not in `all`): where a decoder step's time goes at DECODE_CONTEXTS and
# DECODE_BATCHES: nsa_decode_timeline (each kernel's own time in the step's chain, CUPTI's trace),
# then Nsight Compute's duration and DRAM throughput of the step's linear layers (NCU_PRODUCTS, a
# kernel regex, default the few-row, skinny and projection kernels; the first NCU_LAUNCHES,
# default 120, launches each alone), by kernel and grid (bench/ncu_summary.py --by-grid).
# `copy` (not in `all`): a training experiment for `small` (byte vocabulary) – copying from
# beyond the window, all branches against the window only (see the section below). The needle
# experiment has its own script, scripts/needle_run.sh.
set -uo pipefail
cd "$(dirname "$0")/.."
what=${1:-all}
out=${OUT:-out}
mkdir -p "$out"
base=${BASE:-HEAD~1}
# An Nsight Compute report's duration, occupancy, limits and throughputs (its details page).
ncu_limits() {
  /usr/local/cuda/bin/ncu --import "$1" --page details 2>&1 |
    grep -E "Duration|Registers Per|Achieved Occupancy|Theoretical Occupancy|Block Limit|Compute \(SM\) Throughput|Memory Throughput|L2 Cache Throughput|Warp Cycles Per Issued|Dynamic Shared|Grid Size|Waves Per SM"
}
workshop_base=0
[ "$what" = workshop ] && { [ -n "${BASE:-}" ] || [ -n "${BASE_DIR:-}" ]; } && workshop_base=1
if [ "$what" = compare ] || [ "$what" = final ] || [ "$what" = decode-compare ] ||
  [ "$what" = pytorch-compare ] || [ "$workshop_base" = 1 ]; then
  base_targets=(nsa nsa_workshop); [ "$what" = pytorch-compare ] && base_targets=(nsa nsa_capi)
  (rm -rf /tmp/nsa_base &&
    if [ -n "${BASE_DIR:-}" ]; then cp -r "$BASE_DIR" /tmp/nsa_base; else git worktree add -f /tmp/nsa_base "$base"; fi &&
    cmake -S /tmp/nsa_base -B /tmp/nsa_base/build -G Ninja -DCMAKE_BUILD_TYPE=Release &&
    ninja -C /tmp/nsa_base/build -j8 "${base_targets[@]}") >"$out/build_base.log" 2>&1 &
  base_pid=$!
fi
more_pids=()
if [ "$what" = decode-compare ]; then
  for d in ${MORE_DIRS:-}; do
    (rm -rf "/tmp/nsa_more/$d" && mkdir -p /tmp/nsa_more && cp -r "$d" "/tmp/nsa_more/$d" &&
      cmake -S "/tmp/nsa_more/$d" -B "/tmp/nsa_more/$d/build" -G Ninja -DCMAKE_BUILD_TYPE=Release &&
      ninja -C "/tmp/nsa_more/$d/build" -j6 nsa) >"$out/build_more_$d.log" 2>&1 &
    more_pids+=($!)
  done
fi
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >"$out/cmake.log" 2>&1 &&
  ninja -C build -j16 nsa nsa_cuda_tests nsa_workshop nsa_decode_tile nsa_decode_loads nsa_decode_select nsa_capi >"$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
if [ "$what" = tests ] || [ "$what" = all ] || [ "$what" = final ]; then
  ./build/tests/nsa_cuda_tests 2>&1 | tee "$out/cuda_tests.log" | grep -E "^\[  (PASSED|FAILED)|FAILED|Failure" | head -40
  /usr/local/cuda/bin/compute-sanitizer --tool memcheck --error-exitcode 3 ./build/tests/nsa_cuda_tests \
    --gtest_filter='*h2_batch*:*packed*:*short*' >"$out/sanitizer.log" 2>&1
  echo "compute-sanitizer memcheck rc=$? (0 = clean)"; grep -E "ERROR SUMMARY" "$out/sanitizer.log"
  if [ -n "${RACE_FILTER:-}" ]; then  # racecheck is slow (about a minute per paper-like case)
    /usr/local/cuda/bin/compute-sanitizer --tool racecheck --error-exitcode 3 ./build/tests/nsa_cuda_tests \
      --gtest_filter="$RACE_FILTER" >"$out/racecheck.log" 2>&1
    echo "compute-sanitizer racecheck rc=$? (0 = clean) on $RACE_FILTER"; grep -E "RACECHECK SUMMARY" "$out/racecheck.log"
  fi
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
  for cfg in m7c_125m paper_attn; do
    ./build/nsa bench attention --device cuda --config "$cfg" --seq-lens "${SEQ_LENS:-2048,4096,8192,16384,32768,65536}" \
      --max-seconds "${MAX_SECONDS:-20}" --json "$out/nsa_$cfg.jsonl" 2>&1 | tee "$out/nsa_$cfg.txt"
    python3 bench/dense_attention.py --config "$cfg" --seq-lens "${SEQ_LENS:-2048,4096,8192,16384,32768,65536}" \
      | tee "$out/dense_$cfg.jsonl"
  done
fi
if [ "$what" = compare ] || [ "$what" = final ]; then
  wait "$base_pid" || { echo "base $base did not build"; tail -5 "$out/build_base.log"; exit 1; }
  for spec in ${COMPARE_SHAPES:-m7c_125m:8192,16384,65536 paper_attn:16384,65536}; do
    for bin in /tmp/nsa_base/build/nsa ./build/nsa; do
      echo "== $bin"
      "$bin" bench attention --device cuda --config "${spec%%:*}" --seq-lens "${spec##*:}" 2>&1 | tail -n +2
    done
    python3 bench/dense_attention.py --config "${spec%%:*}" --seq-lens "${spec##*:}"
  done 2>&1 | tee "$out/compare.txt"
  for spec in ${NCU_SHAPES:-m7c_125m:16384 paper_attn:16384}; do
    bins=(./build/nsa); [ "${NCU_BASE:-1}" = 0 ] || bins=(/tmp/nsa_base/build/nsa ./build/nsa)
    for bin in "${bins[@]}"; do
      echo "== ncu $bin ${spec%%:*} S=${spec##*:} (ms per launch sequence: totals over 1 warm-up + 2 timed runs, /3)"
      /usr/local/cuda/bin/ncu --clock-control none --metrics gpu__time_duration.sum --csv "$bin" bench attention --device cuda \
        --config "${spec%%:*}" --seq-lens "${spec##*:}" --reps 2 >/tmp/ncu.csv 2>/dev/null
      python3 bench/ncu_summary.py /tmp/ncu.csv --top 25
    done
  done 2>&1 | tee "$out/ncu.txt"
fi
# workshop (also in `all`): single kernels timed alone (bench/kernels/workshop.cpp), config:S pairs.
if [ "$what" = workshop ] || [ "$what" = all ]; then
  bins=(./build/nsa_workshop)
  if [ "$workshop_base" = 1 ]; then
    wait "$base_pid" || { echo "base did not build"; tail -5 "$out/build_base.log"; exit 1; }
    bins=(/tmp/nsa_base/build/nsa_workshop ./build/nsa_workshop)
  fi
  for spec in ${WORKSHOP_SHAPES:-m7c_125m:8192 m7c_125m:16384 m7c_125m:65536 paper_attn:16384}; do
    for bin in "${bins[@]}"; do
      echo "== $bin" | tee -a "$out/workshop.txt"
      "$bin" --config "${spec%%:*}" --seq-len "${spec##*:}" \
        ${WORKSHOP_KERNELS:-sel_fwd_query sel_fwd_block sel_dq_query dkdv_sel:16 sel_bwd_block} 2>&1 |
        tee -a "$out/workshop.txt"
    done
  done
fi
if [ "$what" = model ] || [ "$what" = all ]; then
  ./build/tests/nsa_cuda_tests --gtest_filter='*CudaModel*:*CudaTrain*' 2>&1 | tee "$out/model_tests.log" |
    grep -E "^\[  (PASSED|FAILED)|FAILED|Failure|loss|worst" | head -40
  ./build/nsa bench train --seq-lens "${TRAIN_SEQ_LENS:-2048,8192,16384,32768,65536}" \
    --json "$out/train_bench.jsonl" 2>&1 | tee "$out/train_bench.txt"
  for policy in ${TRAIN_RECOMPUTE:-ops layers}; do  # the dense baseline ran with the first
    ./build/nsa bench train --recompute "$policy" --seq-lens "${TRAIN_SEQ_LENS:-2048,8192,16384,32768,65536}" \
      --dense-script off --json "$out/train_bench_recompute_$policy.jsonl" 2>&1 |
      tee "$out/train_bench_recompute_$policy.txt"
  done
  if [ -d data/corpus_bytes ]; then
    run=(./build/nsa train --config configs/m7c_125m.yaml --set vocab_size=256 --data data/corpus_bytes
         --device cuda --batch 16 --seq-len 2048 --steps 200 --val-every 50 --ckpt-every 100 --keep 1)
    rm -rf /tmp/m7c_a /tmp/m7c_b
    "${run[@]}" --out /tmp/m7c_a >"$out/m7c_200.txt" 2>&1; echo "straight rc=$?"
    "${run[@]}" --out /tmp/m7c_b --stop-after 100 >"$out/m7c_100.txt" 2>&1
    "${run[@]}" --out /tmp/m7c_b --resume >>"$out/m7c_100.txt" 2>&1; echo "split rc=$?"
    grep -E "step +(1|50|100|150|200)/" "$out/m7c_200.txt"
    cmp /tmp/m7c_a/ckpt_00000200/model.safetensors /tmp/m7c_b/ckpt_00000200/model.safetensors &&
      cmp /tmp/m7c_a/ckpt_00000200/optimizer.safetensors /tmp/m7c_b/ckpt_00000200/optimizer.safetensors &&
      echo "resume: final weights and moments identical"
    cp /tmp/m7c_a/metrics.jsonl "$out/m7c_metrics.jsonl"; cp /tmp/m7c_a/loss.svg "$out/m7c_loss.svg"
  fi
fi
if [ "$what" = decode ] || [ "$what" = all ] || [ "$what" = decode-compare ]; then
  ./build/tests/nsa_cuda_tests --gtest_filter='*Decode*:*Decoder*:*Prefill*' >"$out/decode_tests.log" 2>&1
  echo "decode tests rc=$?"
  grep -E "worst|bit-identical" "$out/decode_tests.log" | head -40
  grep -E "^\[  (PASSED|FAILED)|FAILED|Failure" "$out/decode_tests.log" | head -40  # after the long lines
  /usr/local/cuda/bin/compute-sanitizer --tool memcheck --error-exitcode 3 ./build/tests/nsa_cuda_tests \
    --gtest_filter='*CudaLayerPrefill*tiny:Variants/CudaPrefill.*/0:CudaPrefillErrors.*' >"$out/prefill_sanitizer.log" 2>&1
  echo "compute-sanitizer memcheck (prefill) rc=$? (0 = clean)"; grep -E "ERROR SUMMARY" "$out/prefill_sanitizer.log"
  /usr/local/cuda/bin/compute-sanitizer --tool memcheck --error-exitcode 3 ./build/tests/nsa_cuda_tests \
    --gtest_filter='Shapes/CudaDecodeLayer.*' \
    >"$out/decode_sanitizer.log" 2>&1
  echo "compute-sanitizer memcheck (decode layer) rc=$? (0 = clean)"; grep -E "ERROR SUMMARY" "$out/decode_sanitizer.log"
  /usr/local/cuda/bin/compute-sanitizer --tool racecheck --error-exitcode 3 ./build/tests/nsa_cuda_tests \
    --gtest_filter='Shapes/CudaDecodeLayer.*/tiny' >"$out/decode_racecheck.log" 2>&1
  echo "compute-sanitizer racecheck (decode layer) rc=$? (0 = clean)"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$out/decode_racecheck.log"
  if [ "$what" != decode-compare ]; then
    ./build/nsa bench decode --device cuda --contexts "${DECODE_CONTEXTS:-4096,16384,65536,131072}" \
      --batches "${DECODE_BATCHES:-1,16}" ${DECODE_FLAGS---distinct-layers} --json "$out/decode_bench.jsonl" 2>&1 |
      tee "$out/decode_bench.txt"
  fi
fi
if [ "$what" = decode-compare ]; then
  wait "$base_pid" || { echo "base did not build"; tail -5 "$out/build_base.log"; exit 1; }
  bins=(/tmp/nsa_base/build/nsa)
  for d in ${MORE_DIRS:-}; do bins+=("/tmp/nsa_more/$d/build/nsa"); done
  bins+=(./build/nsa)
  for pid in "${more_pids[@]}"; do wait "$pid" || { echo "a tree of MORE_DIRS did not build"; exit 1; }; done
  for round in $(seq "${ROUNDS:-2}"); do
    for bin in "${bins[@]}"; do
      sdpa=off; [ "$round" = 1 ] && [ "$bin" = /tmp/nsa_base/build/nsa ] && sdpa=auto
      echo "== $bin round $round"
      "$bin" bench decode --device cuda --contexts "${DECODE_CONTEXTS:-65536,131072}" \
        --batches "${DECODE_BATCHES:-1,16}" --prefill none --sdpa-script "$sdpa" ${DECODE_FLAGS---distinct-layers} 2>&1 |
        tail -n +2
    done
  done 2>&1 | tee "$out/decode_compare.txt"
fi
if [ "$what" = decode-trace ]; then
  ./build/nsa bench decode --device cuda --contexts "${DECODE_CONTEXTS:-65536,131072}" \
    --batches "${DECODE_BATCHES:-1,16}" --prefill none --sdpa-script off --trace \
    --json "$out/decode_trace.jsonl" 2>&1 | tee "$out/decode_trace.txt"
fi
if [ "$what" = decode-kernels ]; then
  ninja -C build nsa_decode_timeline >>"$out/build.log" 2>&1 || echo "nsa_decode_timeline did not build (CUPTI?)"
  contexts=${DECODE_CONTEXTS:-65536} batches=${DECODE_BATCHES:-1,4,16}
  for c in ${contexts//,/ }; do
    for b in ${batches//,/ }; do
      echo "== timeline: context $c, B = $b"
      ./build/nsa_decode_timeline --context "$c" --batch "$b" --steps 30 2>&1 | sed -n '/own time per kernel/,$p'
      echo "== ncu: the linear layers alone, context $c, B = $b"
      /usr/local/cuda/bin/ncu --clock-control none --csv -k "regex:${NCU_PRODUCTS:-skinny|gemv|decode_projection|decode_inputs}" \
        -c "${NCU_LAUNCHES:-120}" --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed \
        ./build/nsa bench decode --device cuda --contexts "$c" --batches "$b" --prefill none --sdpa-script off \
        --steps 2 >/tmp/products.csv 2>/dev/null
      python3 bench/ncu_summary.py /tmp/products.csv --by-grid --top 20
    done
  done 2>&1 | tee "$out/decode_kernels.txt"
fi
if [ "$what" = decode-tile ]; then
  ./build/nsa_decode_tile ${DECODE_TILE_ARGS:---ctas 3168} 2>&1 | tee "$out/decode_tile.txt"
fi
if [ "$what" = decode-select ]; then
  {
    ./build/nsa_decode_select ${DECODE_SELECT_ARGS:-}
    echo "== ncu select_loop (nsa_decode_select --contexts 65536): where the merge's warp waits"
    /usr/local/cuda/bin/ncu --clock-control none --section SourceCounters --section WarpStateStats \
      --import-source yes -k regex:select_loop -c 1 -f -o /tmp/hot_select ./build/nsa_decode_select \
      --contexts 65536 >/dev/null 2>&1
    /usr/local/cuda/bin/ncu --import /tmp/hot_select.ncu-rep --page source --csv --print-source cuda,sass \
      >/tmp/hot_select.csv 2>/dev/null
    python3 bench/ncu_hotspots.py /tmp/hot_select.csv --top "${HOTSPOT_TOP:-30}"
  } 2>&1 | tee "$out/decode_select.txt"
fi
if [ "$what" = decode-loads ]; then
  ./build/nsa_decode_loads ${DECODE_LOADS_ARGS:---ctas 74,148,264,1216 --groups 2} 2>&1 | tee "$out/decode_loads.txt"
fi
if [ "$what" = decode-hotspots ]; then
  for k in ${NCU_KERNELS:-parts topk picks}; do
    echo "== ncu ${k}_kernel, m7c_125m decode, context ${DECODE_CONTEXT:-65536}, B = ${DECODE_BATCH:-1}"
    /usr/local/cuda/bin/ncu --clock-control none --cache-control none --warp-sampling-interval "${NCU_SAMPLING:-auto}" \
      --section SourceCounters --section WarpStateStats --section LaunchStats --section Occupancy \
      --section SpeedOfLight --import-source yes -k "regex:${k}_kernel" -s 200 -c 1 \
      -f -o "/tmp/hot_$k" ./build/nsa bench decode --device cuda --contexts "${DECODE_CONTEXT:-65536}" \
      --batches "${DECODE_BATCH:-1}" --prefill none --sdpa-script off --steps 5 >"$out/ncu_$k.log" 2>&1
    ncu_limits "/tmp/hot_$k.ncu-rep"
    /usr/local/cuda/bin/ncu --import "/tmp/hot_$k.ncu-rep" --page raw --csv --metrics \
      gpu__time_duration.sum,smsp__inst_executed.sum,smsp__average_warp_latency_issue_stalled_total.ratio 2>&1 | tail -2
    /usr/local/cuda/bin/ncu --import "/tmp/hot_$k.ncu-rep" --page source --csv --print-source cuda,sass \
      >"/tmp/hot_$k.csv" 2>/dev/null
    python3 bench/ncu_hotspots.py "/tmp/hot_$k.csv" --top "${HOTSPOT_TOP:-25}"
  done 2>&1 | tee "$out/decode_hotspots.txt"
fi
# hotspots (not in `all`): Nsight Compute on single kernels run by the workshop – launch, occupancy,
# speed-of-light and warp-state sections, then the source lines where the warps wait
# (bench/ncu_hotspots.py). HOTSPOTS: space-separated config:S:workshop-kernel:kernel-name-regex.
if [ "$what" = hotspots ]; then
  for spec in ${HOTSPOTS:-m7c_125m:16384:select:select_blocks}; do
    IFS=: read -r cfg s wk kre <<<"$spec"
    echo "== ncu $wk ($kre) $cfg S=$s"
    /usr/local/cuda/bin/ncu --clock-control none --section SourceCounters --section WarpStateStats --section LaunchStats \
      --section Occupancy --section SpeedOfLight --import-source yes -k "regex:$kre" -c 1 -f \
      -o "/tmp/hot_$wk" ./build/nsa_workshop --config "$cfg" --seq-len "$s" --reps 1 "$wk" >/dev/null 2>&1
    ncu_limits "/tmp/hot_$wk.ncu-rep"
    /usr/local/cuda/bin/ncu --import "/tmp/hot_$wk.ncu-rep" --page source --csv --print-source cuda,sass \
      >"/tmp/hot_$wk.csv" 2>/dev/null
    python3 bench/ncu_hotspots.py "/tmp/hot_$wk.csv" --top "${HOTSPOT_TOP:-22}"
  done 2>&1 | tee -a "$out/hotspots.txt"
fi
if [ "$what" = pytorch ] || [ "$what" = pytorch-compare ]; then
  export NSA_CAPI_LIB="$PWD/build/libnsa_capi.so" NSA_BINARY="$PWD/build/nsa" NSA_REQUIRE_CUDA=1
  export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
  python3 -c 'import sys, torch, nsa; print("python", sys.version.split()[0], "torch", torch.__version__,
    "cuda", torch.version.cuda, torch.cuda.get_device_name(), "| custom op:", nsa._cuda.HAS_CUSTOM_OP)'
  if python3 -c 'import pytest' 2>/dev/null; then
    python3 -m pytest -q -rs -s -p no:cacheprovider python/tests/test_cuda.py >"$out/pytorch_cuda_tests.log" 2>&1
    echo "python CUDA tests rc=$?"; grep -E "passed|failed|FAILED|Error" "$out/pytorch_cuda_tests.log" | tail -20
    python3 -m pytest -q -rs -p no:cacheprovider python/tests --ignore=python/tests/test_cuda.py \
      >"$out/pytorch_cpu_tests.log" 2>&1
    echo "python CPU tests on this torch rc=$?"; tail -3 "$out/pytorch_cpu_tests.log"
  else
    echo "(no pytest in this image: python/tests/mini_pytest.py runs test_cuda.py)"
    python3 python/tests/mini_pytest.py python/tests/test_cuda.py >"$out/pytorch_cuda_tests.log" 2>&1
    echo "python CUDA tests rc=$?"; grep -E "^(FAILED|SKIPPED)|passed" "$out/pytorch_cuda_tests.log" | tail -20
  fi
  if [ "$what" = pytorch ]; then
    python3 bench/pytorch_op.py --nsa-binary build/nsa --configs "${PYTORCH_CONFIGS:-m7c_125m,paper_attn}" \
      --seq-lens "${PYTORCH_SEQ_LENS:-16384}" --json "$out/pytorch_op.jsonl" 2>&1 | tee "$out/pytorch_op.txt"
  fi
fi
if [ "$what" = pytorch-compare ]; then
  wait "$base_pid" || { echo "base did not build"; tail -5 "$out/build_base.log"; exit 1; }
  for round in $(seq "${ROUNDS:-2}"); do
    for b in /tmp/nsa_base/build "$PWD/build"; do
      echo "== $b round $round"
      NSA_CAPI_LIB="$b/libnsa_capi.so" python3 bench/pytorch_op.py --nsa-binary "$b/nsa" \
        --configs "${PYTORCH_CONFIGS:-m7c_125m}" --seq-lens "${PYTORCH_SEQ_LENS:-16384}" \
        --json "$out/pytorch_compare.jsonl"
    done
  done 2>&1 | tee "$out/pytorch_compare.txt"
fi
# copy: can training teach copying from beyond the window? Stage 1 as for the needle, then all
# branches and the window only, side by side, on copy rows at S = 1024 (periods up to 512, w = 256),
# then the far-copy probe (scripts/copy_probe.py) on both.
if [ "$what" = copy ]; then
  base=(--config configs/small.yaml --set vocab_size=256 --device cuda --val-batches 8 --keep 1)
  rm -rf /tmp/copy_stage1 /tmp/copy_nsa /tmp/copy_win
  ./build/nsa train "${base[@]}" --data copy --seq-len 512 --batch 32 --steps "${STAGE1_STEPS:-1800}" \
    --lr 2e-3 --min-lr 2e-3 --warmup 100 --val-every 0 --ckpt-every 100000 --out /tmp/copy_stage1 \
    >"$out/copy_stage1.txt" 2>&1; echo "stage 1 rc=$?"; grep -E "step +[0-9]*00/" "$out/copy_stage1.txt" | awk 'NR%3==0' | cut -c1-60
  common=("${base[@]}" --data copy --seq-len "${COPY_SEQ:-1024}" --batch 16 --steps "${COPY_STEPS:-6000}"
          --lr 1e-3 --min-lr 1e-3 --warmup 50 --val-every 500 --ckpt-every 500 --init-from /tmp/copy_stage1)
  timeout "${COPY_TRAIN_S:-200}" ./build/nsa train "${common[@]}" --out /tmp/copy_nsa >"$out/copy_nsa_train.txt" 2>&1 &
  timeout "${COPY_TRAIN_S:-200}" ./build/nsa train "${common[@]}" --branches win --out /tmp/copy_win \
    >"$out/copy_win_train.txt" 2>&1 &
  wait
  for r in nsa win; do
    echo "== $r"; grep -E "val" "$out/copy_${r}_train.txt" | cut -c1-40,100- | tail -12
    python3 scripts/copy_probe.py /tmp/copy_$r --device cuda --periods 64,200,300,400,500
  done
fi
