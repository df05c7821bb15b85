#!/usr/bin/env python3
"""The prefill report: bench_prefill's JSON and prefill_peer.py's JSON of the same run as markdown
tables (TFLOP/s, % of the cuBLASLt GEMM ceiling, SDPA flash and cuDNN, ratios), then the paging
and block-size rows and the variants (1: the mma.sync body; 2, 3: its other CTA shapes).
Usage: prefill_report.py bench_prefill.json prefill_peer.json > report.md"""
import json
import re
import sys

SHAPES = {0: ("prompt_4k", "one 4k prompt"), 1: ("prompt_16k", "one 16k prompt"),
          2: ("prompts_16x1k", "16 prompts of 1k"), 3: ("chunk_512_over_8k", "512 over 8k cached")}


def load_bench(path):
    rows, gemm = {}, None
    for b in json.load(open(path))["benchmarks"]:
        if b.get("error_occurred"):
            continue
        if b["name"].startswith("gemm_ceiling"):
            gemm = b["TFLOPs"]
            continue
        args = dict((k, int(v)) for k, v in re.findall(r"(\w+):(\d+)", b["name"]))
        key = (args["shape"], args["batch"], args["hkv"], args["bs"], args["identity"], args.get("variant", 0))
        rows[key] = b
    return rows, gemm


def peer_of(peers, shape, batch, hkv, backend):
    for r in peers:
        if r["shape"] == SHAPES[shape][0] and r["batch"] == batch and r["hkv"] == hkv:
            v = r.get(backend)
            return v["TFLOPs"] if isinstance(v, dict) else None
    return None


def fmt(x, spec=".1f"):
    return "n/a" if x is None else format(x, spec)


def main():
    rows, gemm = load_bench(sys.argv[1])
    peers = json.load(open(sys.argv[2]))["results"] if len(sys.argv) > 2 else []
    print(f"GEMM ceiling (cuBLASLt bf16 8192^3, this run): {fmt(gemm)} TFLOP/s\n")
    print("| shape | heads | body | ours TFLOP/s | % GEMM | mma.sync body | ours / mma.sync | SDPA flash | "
          "ours / flash | SDPA cuDNN | ours / cuDNN |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for shape, batch in ((0, 1), (1, 1), (2, 16), (3, 1), (3, 8)):
        for hkv in (32, 8):
            b = rows.get((shape, batch, hkv, 16, 0, 0))
            if not b:
                continue
            ours = b["TFLOPs"]
            mma = rows.get((shape, batch, hkv, 16, 0, 1))
            mma = mma["TFLOPs"] if mma else None
            body = {1: "mma.sync", 2: "wgmma"}.get(int(b.get("body", 1)), "?")
            flash, cudnn = (peer_of(peers, shape, batch, hkv, k) for k in ("flash", "cudnn"))
            name = SHAPES[shape][1] + (f", batch {batch}" if shape == 3 else "")
            print(f"| {name} | 32/{hkv} | {body} | {ours:.1f} | {b['pct_gemm']:.1f}% | {fmt(mma)} | "
                  f"{fmt(ours / mma if mma else None, '.2f')} | {fmt(flash)} | "
                  f"{fmt(ours / flash if flash else None, '.2f')} | {fmt(cudnn)} | "
                  f"{fmt(ours / cudnn if cudnn else None, '.2f')} |")
    print("\n4k prompt, paging (us; % slower than block 16 over an identity table):\n")
    print("| body | heads | identity, bs 16 | shuffled bs 16 | bs 1 | bs 64 | bs 256 |")
    print("|---|---|---|---|---|---|---|")
    for variant, body in ((0, "shipped"), (1, "mma.sync")):
        for hkv in (32, 8):
            ident = rows.get((0, 1, hkv, 16, 1, variant))
            if not ident:
                continue
            cells = []
            for bs in (16, 1, 64, 256):
                b = rows.get((0, 1, hkv, bs, 0, variant))
                cells.append("n/a" if not b else f"{b['us']:.1f} ({100 * (b['us'] / ident['us'] - 1):+.1f}%)")
            print(f"| {body} | 32/{hkv} | {ident['us']:.1f} | " + " | ".join(cells) + " |")
    variants = sorted({k[5] for k in rows if k[5] > 0})
    if variants:
        print("\nVariants (TFLOP/s; 0: shipped prefill(), 1: the mma.sync body, 2: its 4 x 1 x 64 shape, "
              "3: its 8 x 2 x 64 shape, 4: the wgmma body with every K/V tile by cp.async):\n")
        print("| shape | heads | " + " | ".join(f"variant {v}" for v in [0] + variants) + " |")
        print("|---|---|" + "---|" * (len(variants) + 1))
        for shape, batch in ((0, 1), (1, 1), (2, 16), (3, 8)):
            for hkv in (32, 8):
                cells = [rows.get((shape, batch, hkv, 16, 0, v)) for v in [0] + variants]
                name = SHAPES[shape][1] + (f", batch {batch}" if shape == 3 else "")
                print(f"| {name} | 32/{hkv} | " + " | ".join("n/a" if not c else f"{c['TFLOPs']:.1f}" for c in cells)
                      + " |")


if __name__ == "__main__":
    main()
