#!/usr/bin/env python3
"""Warp-state samples of a kernel's SASS regions (index ranges of the source page's instructions,
`ncu --import R --page source --csv --print-source sass`), by stall reason: the table of run
ncu-1 (docs/journal/prefill-kernel.md, session 6). Regions are given as NAME:FIRST-LAST
(instruction indices, inclusive), read off the SASS (ncu_source_breakdown.py, the HGMMA, BAR and
EXIT positions).

  ncu_regions.py R.source.csv prologue:0-420 item_start:421-1222 ...
"""
import csv
import sys

REASONS = ["stall_wait", "stall_long_sb", "stall_barrier", "stall_short_sb", "stall_no_inst", "stall_selected",
           "stall_not_selected", "stall_dispatch", "stall_math"]


def main():
    rows = list(csv.reader(open(sys.argv[1], newline="")))
    header = rows[1]
    ins = [dict(zip(header, r)) for r in rows[2:] if len(r) == len(header)]
    total = sum(float(i["# Samples"]) for i in ins)
    print(f"{sys.argv[1]}: {total:.0f} samples")
    print("| region | instructions | executed (warp) | samples | % | " + " | ".join(r[6:] for r in REASONS) + " |")
    print("|---|---|---|---|---|" + "---|" * len(REASONS))
    for spec in sys.argv[2:]:
        name, rng = spec.split(":")
        a, b = (int(x) for x in rng.split("-"))
        part = ins[a:b + 1]
        s = sum(float(i["# Samples"]) for i in part)
        ex = sum(float(i["Instructions Executed"]) for i in part)
        print(f"| {name} | {len(part)} | {ex / 1e6:.2f}M | {s:.0f} | {100 * s / total:.1f} | "
              + " | ".join(f"{sum(float(i[r]) for i in part):.0f}" for r in REASONS) + " |")


if __name__ == "__main__":
    main()
