#!/usr/bin/env bash
# On a GPU machine: the kernel workshop (bench/kernels/workshop.cpp) for several builds in one call,
# so that variants of a kernel are timed on the same card one after the other. Each of TREES (source
# trees, e.g. `git archive` copies made before the call: prev_tree for the build before, var_tree
# for a variant) is built in /tmp/b_<tree>, this tree in build/; then for every config:S of SHAPES
# each build runs KERNELS (workshop kernel names) in the order TREES, this tree. Also builds the
# CUDA tests of this tree, for the caller to run after. Logs to $OUT (or out/).
#   TREES="prev_tree var_tree" SHAPES="paper_attn:16384" KERNELS="dkdv_cmp:64 layer_bwd" \
#     bash scripts/workshop_variants.sh
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-out}
mkdir -p "$out"
trees=${TREES:-prev_tree}
for t in $trees; do
  (cmake -S "$t" -B "/tmp/b_$t" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null &&
    ninja -C "/tmp/b_$t" -j5 nsa_workshop) >"$out/build_$t.log" 2>&1 &
done
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >"$out/cmake.log" 2>&1 &&
  ninja -C build -j6 nsa_workshop nsa_cuda_tests >"$out/build.log" 2>&1 || { tail -20 "$out/build.log"; exit 1; }
wait
for spec in ${SHAPES:-m7c_125m:16384 paper_attn:16384}; do
  for bin in $(for t in $trees; do echo "/tmp/b_$t/nsa_workshop"; done) ./build/nsa_workshop; do
    echo "== $bin"
    "$bin" --config "${spec%%:*}" --seq-len "${spec##*:}" ${KERNELS:-sel_bwd_block layer_bwd}
  done
done 2>&1 | tee "$out/workshop_variants.txt"
