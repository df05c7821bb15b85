#!/usr/bin/env python3
"""A variant of the wgmma prefill against the shipped body (docs/journal/prefill-kernel.md, session
6, runs dg): bench_prefill's JSON of two repetitions in random interleaved order, each row's runs
of the shipped body (variant 0) and of the variant, the ratio of the means and the spread of each
(max - min over min, in %), the variant's largest output difference from the shipped body; then
the shipped rows (mean of their runs) against SDPA and FlashInfer from the same call.
Usage: prefill_variant_summary.py VARIANT bench.json [prefill-peer.json [flashinfer-prefill.json]]"""
import json
import re
import statistics
import sys

SHAPES = {0: "prompt_4k", 1: "prompt_16k", 2: "prompts_16x1k", 3: "chunk_512_over_8k"}
NAMES = {0: "one 4k prompt", 1: "one 16k prompt", 2: "16 prompts of 1k", 3: "512 over 8k"}


def spread(runs):
    return 100.0 * (max(runs) - min(runs)) / min(runs) if len(runs) > 1 else 0.0


def main():
    variant = int(sys.argv[1])
    rows, gemm = {}, None
    for b in json.load(open(sys.argv[2]))["benchmarks"]:
        if b.get("run_type") != "iteration" or b.get("error_occurred"):
            continue
        if b["name"].startswith("gemm_ceiling"):
            gemm = b["TFLOPs"]
            continue
        a = {k: int(v) for k, v in re.findall(r"(\w+):(\d+)", b["name"])}
        key = (a["shape"], a["batch"], -a["hkv"], a["bs"], a["identity"])
        rows.setdefault(key, {}).setdefault(a["variant"], []).append(b["TFLOPs"] if "TFLOPs" in b else 0.0)
        if a["variant"] == variant:
            rows[key].setdefault("diff", []).append(b.get("max_diff_vs_shipped", float("nan")))
    print(f"GEMM ceiling {gemm:.1f} TFLOP/s" if gemm else "GEMM ceiling n/a")
    print(f"| shape | batch | heads | bs | identity | shipped (0) | variant {variant} | {variant} / 0 "
          "| spread 0 % | spread v % | max_diff |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    means = {}
    for key in sorted(rows):
        v = rows[key]
        base, var = v.get(0, []), v.get(variant, [])
        ratio = f"{statistics.mean(var) / statistics.mean(base):.3f}" if base and var else "-"
        shape, batch, hkv, bs, ident = key
        print(f"| {NAMES[shape]} | {batch} | 32/{-hkv} | {bs} | {ident} | " + ", ".join(f"{x:.1f}" for x in base) +
              " | " + ", ".join(f"{x:.1f}" for x in var) + f" | {ratio} | {spread(base):.1f} | {spread(var):.1f} | "
              + f"{max(v.get('diff', [float('nan')]))} |")
        if base and not ident:
            means[(SHAPES[shape], batch, -hkv, bs)] = (statistics.mean(base), statistics.mean(var) if var else None)
    peers = {}
    for path in sys.argv[3:]:
        try:
            for r in json.load(open(path))["results"]:
                for backend in ("flash", "cudnn", "fa2", "fa3"):
                    if isinstance(r.get(backend), dict):
                        peers[(r["shape"], r["batch"], r["hkv"], backend)] = r[backend]["TFLOPs"]
        except (OSError, ValueError, KeyError) as e:
            print(f"(peers {path}: {e})")
    if not peers:
        return
    print()
    print(f"| shape | batch | heads | shipped (mean) | variant {variant} (mean) | SDPA flash | SDPA cuDNN | FlashInfer fa2 "
          "| fa3 | 0 / fa3 | v / fa3 | 0 / cuDNN | v / cuDNN |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for (shape, batch, hkv, bs), (t, tv) in sorted(means.items()):
        if bs != 16:
            continue
        p = [peers.get((shape, batch, hkv, b)) for b in ("flash", "cudnn", "fa2", "fa3")]
        cells = [f"{x:.1f}" if x else "n/a" for x in p]
        fa3, cudnn = p[3], p[1]
        r = [f"{a / b:.2f}" if a and b else "n/a" for a, b in ((t, fa3), (tv, fa3), (t, cudnn), (tv, cudnn))]
        print(f"| {shape} | {batch} | 32/{hkv} | {t:.1f} | " + (f"{tv:.1f}" if tv else "-") + " | " +
              " | ".join(cells) + " | " + " | ".join(r) + " |")


if __name__ == "__main__":
    main()
