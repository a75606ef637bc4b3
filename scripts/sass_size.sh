#!/usr/bin/env bash
# Code size of each kernel of one CUDA source, from the cubin nvcc makes of it with the build's own
# flags (bytes of SASS; 16 bytes an instruction on Hopper) – no GPU needed. At batch 1 a decode CTA
# runs each instruction about once, so its kernels' size shows as instruction-cache misses
# (docs/perf.md, fifteenth session): this is the number to watch beside the benchmark.
#   bash scripts/sass_size.sh [SOURCE]   (default src/cuda/nsa/nsa_decode.cu; needs build/)
set -euo pipefail
cd "$(dirname "$0")/.."
src=${1:-src/cuda/nsa/nsa_decode.cu}
cmd=$(ninja -C build -t commands | grep -F -- "$src" | grep -F nvcc | head -1)
[ -n "$cmd" ] || { echo "sass_size.sh: no nvcc command for $src in build/ (configure with CUDA)" >&2; exit 1; }
out=$(mktemp --suffix=.cubin)
trap 'rm -f "$out"' EXIT
# One real architecture, a cubin instead of an object, no dependency file.
cmd=$(echo "$cmd" | sed -E "s#--generate-code=arch=compute_([0-9a-z]+),code=\[[^]]*\]#-arch=sm_\1#;
  s#-o [^ ]+#-cubin -o $out#; s#-MD -MT [^ ]+ -MF [^ ]+##; s# -c # #; s#-Xcompiler=-fPIC##")
(cd build && eval "$cmd")
printf "%8s %7s  %s\n" bytes instr kernel
readelf -SW "$out" 2>/dev/null | sed -nE 's/.*\] \.text\.([^ ]+) +[A-Z]+ +[0-9a-f]+ +[0-9a-f]+ +([0-9a-f]+) .*/\2 \1/p' |
  while read -r size name; do
    bytes=$((16#$size))
    printf "%8d %7d  %s\n" "$bytes" "$((bytes / 16))" "$(echo "$name" | c++filt | sed -E 's/\(anonymous namespace\):://')"
  done | sort -rn
