#!/usr/bin/env python3
"""Before/after ratios of two builds of a benchmark (bench_decode, bench_cache_ops) run in one device call.

The A/B protocol of docs/benchmarks.md: each binary runs the same --benchmark_filter twice,
alternating, with --benchmark_counters_tabular=true, its console output saved as
DIR/<name>.<round>.txt. Prints, per row (the ceilings last), the median time of each binary, after / before,
and the range of that ratio over the rounds (min after / max before .. max after / min before).

    compare_ab.py DIR before_name after_name
"""
import glob
import re
import statistics
import sys


def load(path):
    """Row name -> time in microseconds, from a Google Benchmark console table."""
    times = {}
    for line in open(path):
        if "/manual_time" not in line:
            continue
        name, t, unit = line.split()[:3]
        times[name] = float(t) * (1000.0 if unit == "ms" else 1.0)
    return times


def main():
    folder, before, after = sys.argv[1:4]
    runs = {b: [load(f) for f in sorted(glob.glob(f"{folder}/{b}.*.txt"))] for b in (before, after)}
    ceilings = ("read_ceiling", "copy_ceiling")
    for name in [n for n in runs[before][0] if not n.startswith(ceilings)]:
        b = [r[name] for r in runs[before] if name in r]
        a = [r[name] for r in runs[after] if name in r]
        if not a or not b:
            continue
        short = re.sub(r"/(min_time|manual_time).*", "", name).replace("decode_", "")
        ratio = statistics.median(a) / statistics.median(b)
        print(f"{short:75s} {statistics.median(b):10.1f} {statistics.median(a):10.1f}  {ratio:.3f}"
              f"  ({min(a) / max(b):.3f}-{max(a) / min(b):.3f})")
    for b in (before, after):
        for c in ceilings:
            times = [r[n] for r in runs[b] for n in r if n.startswith(c)]
            if times:
                print(b, c, "us:", times)


if __name__ == "__main__":
    main()
