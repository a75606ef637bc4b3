#!/usr/bin/env python3
"""Far-copy probe for a byte-vocabulary checkpoint: can the model continue a periodic sequence
whose period lies beyond the sliding window? For each period P it prompts `nsa generate` (greedy)
with 1.5 periods of random symbols plus a few tokens, and counts how many of the next 16 tokens
repeat the token P back. Within the window every trained copier scores 16/16; past it only the
compressed/selected branches can reach the source.

    python3 scripts/copy_probe.py RUN_DIR [--device cuda] [--periods 64,200,300,600,1200]
"""
import argparse
import random
import subprocess

ap = argparse.ArgumentParser()
ap.add_argument("run")
ap.add_argument("--device", default="cpu")
ap.add_argument("--periods", default="64,200,300,600,1200")
ap.add_argument("--trials", type=int, default=3)
ap.add_argument("--nsa", default="./build/nsa")
a = ap.parse_args()
rng = random.Random(0)
for period in [int(p) for p in a.periods.split(",")]:
    right = 0
    for _ in range(a.trials):
        cycle = [rng.randrange(40, 127) for _ in range(period)]
        n = period + period // 2 + 37
        seq = cycle * 3
        out = subprocess.run([a.nsa, "generate", "--run", a.run, "--device", a.device,
                              "--prompt", bytes(seq[:n]).decode("latin-1"), "--max-new", "16",
                              "--temperature", "0"], capture_output=True, check=True).stdout
        right += sum(x == y for x, y in zip(out[-16:], seq[n:n + 16]))
    print(f"period {period:5d}: {right}/{16 * a.trials} next tokens copied")
