#!/usr/bin/env python3
"""Side by side: the metrics of several Nsight Compute raw-page exports (`ncu --import R
--page raw --csv > R.raw.csv`), one column a report, one row a metric; the launch, time, cycles,
occupancy, instructions, pipe utilisation (every tensor-pipe metric), issue, warp-stall (per
issue-active) and memory metrics (run_prefill_ncu_device.sh; docs/journal/prefill-kernel.md,
session 6, run ncu-1).

  ncu_summary.py A.raw.csv B.raw.csv ...
"""
import csv
import os
import re
import sys

EXACT = [
    "Kernel Name", "Grid Size", "Block Size", "gpu__time_duration.sum", "sm__cycles_elapsed.max",
    "sm__cycles_active.min", "sm__cycles_active.avg", "sm__cycles_active.max",
    "launch__grid_size", "launch__block_size", "launch__registers_per_thread",
    "launch__shared_mem_per_block_dynamic", "launch__shared_mem_per_block_static", "launch__waves_per_multiprocessor",
    "sm__maximum_warps_per_active_cycle_pct", "sm__warps_active.avg.pct_of_peak_sustained_active",
    "smsp__inst_executed.sum", "sm__inst_executed.avg.per_cycle_active", "smsp__issue_active.avg.pct_of_peak_sustained_active",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed", "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
    "dram__bytes_read.sum", "dram__bytes_write.sum", "lts__t_bytes.sum", "lts__t_sector_hit_rate.pct",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed", "smsp__pcsamp_sample_count",
]
PATTERNS = [
    r"^sm__pipe_tensor.*pct_of_peak_sustained_active$", r"^sm__inst_executed_pipe_tensor.*",
    r"^smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio$", r"^smsp__pcsamp_warps_issue_stalled_.*",
]


def load(path):
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    rows = [r for r in rows if r and not r[0].startswith("==")]
    header, units, values = rows[0], rows[1], rows[2] if len(rows) > 2 else []
    return {h: (v, u) for h, u, v in zip(header, units, values)}


def main():
    reports = [(os.path.basename(p).split(".")[0], load(p)) for p in sys.argv[1:]]
    names = list(EXACT)
    for pat in PATTERNS:
        for _, r in reports:
            names += [n for n in sorted(r) if re.match(pat, n) and n not in names]
    print("| metric | unit | " + " | ".join(n for n, _ in reports) + " |")
    print("|---|---|" + "---|" * len(reports))
    for n in names:
        vals = [r.get(n, ("-", ""))[0] for _, r in reports]
        unit = next((r[n][1] for _, r in reports if n in r), "")
        if all(v in ("-", "", "n/a") for v in vals):
            continue
        if n == "Kernel Name":
            vals = [v[:60] for v in vals]
        print(f"| {n} | {unit} | " + " | ".join(vals) + " |")


if __name__ == "__main__":
    main()
