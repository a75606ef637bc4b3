#!/usr/bin/env python3
"""Sums Nsight Compute's per-launch gpu__time_duration by kernel name (benchmarks only).

  ncu --clock-control none --metrics gpu__time_duration.sum --csv CMD > launches.csv
  python3 bench/ncu_summary.py launches.csv [--top 25] [--by-grid]

--by-grid: one line per kernel name and grid size instead (the same kernel at different shapes,
e.g. the decoder's products), with the median µs of a launch and, where the CSV has it
(--metrics ...,dram__throughput.avg.pct_of_peak_sustained_elapsed), the median DRAM throughput.
"""
import argparse
import collections
import csv
import re
import statistics

SCALE_MS = {"nsecond": 1e-6, "ns": 1e-6, "usecond": 1e-3, "us": 1e-3, "msecond": 1.0, "ms": 1.0}
DRAM = "dram__throughput.avg.pct_of_peak_sustained_elapsed"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--by-grid", action="store_true")
    args = ap.parse_args()
    with open(args.csv, newline="") as f:
        lines = [line for line in f if line.startswith('"')]
    launches = collections.defaultdict(dict)  # launch ID -> {"key": ..., metric: value}
    for row in csv.DictReader(lines):
        name = re.sub(r"\(.*", "", row["Kernel Name"])[:90]
        key = (name, row.get("Grid Size", "")) if args.by_grid else (name, "")
        value = float(row["Metric Value"].replace(",", ""))
        launch = launches[row["ID"]]
        launch["key"] = key
        if row.get("Metric Name") == "gpu__time_duration.sum":
            launch["ms"] = value * SCALE_MS[row["Metric Unit"]]
        elif row.get("Metric Name") == DRAM:
            launch["dram"] = value
    groups = collections.defaultdict(list)
    for launch in launches.values():
        if "ms" in launch:
            groups[launch["key"]].append(launch)
    total = {k: sum(x["ms"] for x in v) for k, v in groups.items()}
    grand = sum(total.values())
    order = sorted(total, key=total.get, reverse=True)[: args.top]
    if not args.by_grid:
        print(f"{'ms':>9} {'share':>6} {'launches':>8}  kernel   (total {grand:.3f} ms)")
        for key in order:
            print(f"{total[key]:9.3f} {100 * total[key] / grand:5.1f}% {len(groups[key]):8d}  {key[0]}")
        return
    print(f"{'µs/launch':>9} {'DRAM %':>6} {'launches':>8} {'grid':>16}  kernel   (total {grand:.3f} ms)")
    for key in order:
        g = groups[key]
        us = 1e3 * statistics.median(x["ms"] for x in g)
        drams = [x["dram"] for x in g if "dram" in x]
        dram = f"{statistics.median(drams):6.1f}" if drams else f"{'-':>6}"
        print(f"{us:9.2f} {dram} {len(g):8d} {key[1]:>16}  {key[0]}")


if __name__ == "__main__":
    main()
