#!/usr/bin/env python3
"""Top source lines of one kernel by warp-stall samples, from Nsight Compute's source page:

  ncu --clock-control none --section SourceCounters --section WarpStateStats --import-source yes -k regex:NAME -c 1 \
      -o rep <program>
  ncu --import rep.ncu-rep --page source --csv --print-source cuda,sass > src.csv
  python3 bench/ncu_hotspots.py src.csv [--top 30]

Prints, per CUDA source line with samples, its share of all samples, the top stall reasons there,
its instructions executed, and the line, so that an optimisation starts from where the warps
wait, not from a guess."""
import argparse
import csv
import os


def number(x):
    try:
        return float(str(x).replace(",", ""))
    except ValueError:
        return 0.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=30)
    a = ap.parse_args()
    lines, path, head = [], "?", None
    for r in csv.reader(open(a.csv, newline="")):
        if r and r[0] in ("File Path", "File Name"):
            path, head = os.path.basename(r[1]), None
        elif r and r[0] == "Line No":
            head = r
        elif head and len(r) == len(head) and r[0]:  # a CUDA line (SASS rows have no line number)
            row = dict(zip(head[2:], r[2:]))  # the CUDA line's own columns start after its source
            row["where"], row["text"] = "%s:%s" % (path, r[0]), r[1]
            lines.append(row)
    if not lines:
        raise SystemExit("no source lines with metrics in %s (use --print-source cuda,sass)" % a.csv)
    key = "Warp Stall Sampling (All Samples)"
    total = sum(number(x.get(key)) for x in lines) or 1.0
    lines.sort(key=lambda x: -number(x.get(key)))
    print("%6s %11s  %-34s %-26s %s" % ("share", "instr", "top stalls", "where", "line"))
    for x in lines[:a.top]:
        if number(x.get(key)) == 0:
            break
        stalls = sorted(((number(v), k[6:]) for k, v in x.items()
                         if k.startswith("stall_") and "Not Issued" not in k), reverse=True)
        top = " ".join("%s:%.0f" % (k, 100 * v / max(number(x.get(key)), 1)) for v, k in stalls[:3] if v)
        print("%5.1f%% %11.0f  %-34s %-26s %s" % (100 * number(x.get(key)) / total,
                                                   number(x.get("Instructions Executed")), top,
                                                   x["where"], x["text"].strip()[:90]))


if __name__ == "__main__":
    main()
