#!/usr/bin/env python3
"""The Markdown table of merge_states in docs/benchmarks.md: bench_cache_ops' `merge_states` rows
(its JSON) beside merge_peer.py's PyTorch and FlashInfer times from the same run.
Usage: merge_report.py cache_ops.json merge_peer.json"""
import json
import re
import sys


def main():
    ours, ceiling = {}, None
    for b in json.load(open(sys.argv[1]))["benchmarks"]:
        if b.get("run_type") == "aggregate":
            continue
        if b["name"].startswith("copy_ceiling"):
            ceiling = b["GBps"]
        elif b["name"].startswith("merge_states"):
            args = dict((k, int(v)) for k, v in re.findall(r"(\w+):(\d+)", b["name"]) if k != "min_time")
            ours[(args["rows"], args["states"])] = b
    peer = json.load(open(sys.argv[2]))
    print(f"Copy ceiling measured by bench_cache_ops in this run: **{ceiling:.0f} GB/s**. "
          f"PyTorch {peer['torch']}, FlashInfer {peer['flashinfer']} on {peer['device']}.\n")
    print("| rows | states | MB moved | ours us | ours % copy ceiling | FlashInfer us | FlashInfer time / ours "
          "| PyTorch us | PyTorch time / ours |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in peer["results"]:
        b = ours.get((r["rows"], r["states"]))
        if not b:
            continue
        fi = r.get("flashinfer_us")
        fi_cells = f"{fi:.2f} | {fi / b['us']:.2f}" if fi else "- | -"
        print(f"| {r['rows']} | {r['states']} | {b['MB']:.2f} | {b['us']:.2f} | {b['pct_ceiling']:.1f} | {fi_cells} | "
              f"{r['torch_us']:.1f} | {r['torch_us'] / b['us']:.1f} |")


if __name__ == "__main__":
    main()
