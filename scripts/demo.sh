#!/usr/bin/env bash
# The main job for now: build nsa, generate an NSA attention problem, run the CPU reference
# forward + backward on it through the interop command, show what came out, and time a small
# sweep of sequence lengths. Outputs land in out/.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install_deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build build -j "$(nproc)" --target nsa

mkdir -p out
./build/nsa attention --write-example out/example.safetensors --config small --batch 2 --seq-len 1000
./build/nsa attention --in out/example.safetensors --out out/result.safetensors
./build/nsa inspect out/result.safetensors
./build/nsa bench attention --device cpu --config tiny --seq-lens 1024,2048,4096 --json out/bench.jsonl
