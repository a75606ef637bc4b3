#!/usr/bin/env python3
"""Sums Nsight Compute's per-launch gpu__time_duration by kernel name (benchmarks only).

  ncu --clock-control none --metrics gpu__time_duration.sum --csv CMD > launches.csv
  python3 bench/ncu_summary.py launches.csv [--top 25]
"""
import argparse
import collections
import csv
import re


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    total = collections.Counter()
    count = collections.Counter()
    with open(args.csv, newline="") as f:
        lines = [line for line in f if line.startswith('"')]
    for row in csv.DictReader(lines):
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        name = re.sub(r"\(.*", "", row["Kernel Name"])[:90]
        scale = {"nsecond": 1e-6, "ns": 1e-6, "usecond": 1e-3, "us": 1e-3, "msecond": 1.0,
                 "ms": 1.0}[row["Metric Unit"]]
        total[name] += float(row["Metric Value"].replace(",", "")) * scale
        count[name] += 1
    grand = sum(total.values())
    print(f"{'ms':>9} {'share':>6} {'launches':>8}  kernel   (total {grand:.3f} ms)")
    for name, ms in total.most_common(args.top):
        print(f"{ms:9.3f} {100 * ms / grand:5.1f}% {count[name]:8d}  {name}")


if __name__ == "__main__":
    main()
