#!/usr/bin/env python3
"""Turns bench_decode's JSON, sdpa_peer.py's JSON and (when it ran) flashinfer_peer.py's JSON into
the Markdown tables (and a plot) of docs/benchmarks.md, section Kernels.
Usage: report.py bench.json sdpa.json [plot.png] [--flashinfer flashinfer.json]"""
import argparse
import json
import re
import sys


def load_ours(path):
    data = json.load(open(path))
    ceiling, streams, rows = None, {}, []
    for b in data["benchmarks"]:
        if b.get("run_type") == "aggregate" or "error_occurred" in b and b["error_occurred"]:
            continue
        name = b["name"]
        if name.startswith("read_ceiling"):
            ceiling = b["GBps"]
            streams = {k: b[k] for k in ("loads_GBps", "copies_1_GBps", "copies_2_GBps") if k in b}
            continue
        group = name.split("/")[0].replace("decode_", "")
        args = dict((k, int(v)) for k, v in re.findall(r"(\w+):(\d+)", name) if k != "min_time")
        args.update(group=group, us=b["us"], GBps=b["GBps"], pct=b["pct_ceiling"], splits=int(b["splits"]))
        rows.append(args)
    return data.get("context", {}), (ceiling, streams), rows


def find(rows, **kw):
    for r in rows:
        if all(r.get(k) == v for k, v in kw.items()):
            return r
    return None


def with_shape_row(rows, group):
    """Each row of `group` paired with the baseline row of its batch, context and KV heads that the
    variant is compared with: the `shape` row (bf16, NHD, shuffled), or for an fp8 variant of
    another group the `fp8` row; rows without one are left out."""
    for r in rows:
        if r["group"] != group:
            continue
        base = "fp8" if r.get("fp8") and group != "fp8" else "shape"
        b = find(rows, group=base, batch=r["batch"], ctx=r["ctx"], hkv=r["hkv"])
        if b:
            yield r, b


def heading(out, title, columns):
    """A Markdown table's title, header row and separator row."""
    out.append(f"\n### {title}\n")
    out.append("| " + " | ".join(columns) + " |")
    out.append("|" + "---|" * len(columns))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("bench")
    parser.add_argument("sdpa")
    parser.add_argument("plot", nargs="?")
    parser.add_argument("--flashinfer")
    args = parser.parse_args()
    ctx, (ceiling, streams), rows = load_ours(args.bench)
    sdpa = json.load(open(args.sdpa))
    peers = {(r["batch"], r["ctx"], r["hq"], r["hkv"]): r for r in sdpa["results"]}
    fi = json.load(open(args.flashinfer)) if args.flashinfer else None
    fi_peers = {(r["batch"], r["ctx"], r["hq"], r["hkv"]): r for r in fi["results"]} if fi else {}
    out = []
    detail = ("the fastest of: 16-byte loads {loads_GBps:.0f}, 16-byte cp.async one CTA an SM {copies_1_GBps:.0f}, "
              "two an SM {copies_2_GBps:.0f}".format(**streams) if len(streams) == 3 else "16-byte loads")
    out.append(f"Read ceiling measured by bench_decode in this run: **{ceiling:.0f} GB/s** "
               f"(one pass over 2 GiB each; {detail}). PyTorch {sdpa['torch']} on {sdpa['device']}.")
    heading(out, "Decode, bf16, head_dim 128, block 16, shuffled block table, vs SDPA on contiguous KV",
            ["heads q/kv", "batch", "context", "ours us", "ours GB/s", "ours % ceiling", "splits", "SDPA us",
             "SDPA % ceiling", "SDPA time / ours"])
    for r in rows:
        if r["group"] != "shape":
            continue
        p = peers.get((r["batch"], r["ctx"], r["hq"], r["hkv"]))
        peer = f"{p['us']:.1f} | {100 * p['GBps'] / ceiling:.1f} | {p['us'] / r['us']:.2f}" if p else "- | - | -"
        out.append(f"| {r['hq']}/{r['hkv']} | {r['batch']} | {r['ctx']} | {r['us']:.1f} | {r['GBps']:.0f} | "
                   f"{r['pct']:.1f} | {r['splits']} | {peer} |")
    if fi:
        heading(out, f"vs FlashInfer {fi['flashinfer']} (BatchDecodeWithPagedKVCacheWrapper, NHD, page 16, "
                "shuffled pages, CUDA graph; the faster of its CUDA-core and tensor-core decode)",
                ["heads q/kv", "batch", "context", "ours us", "FlashInfer us", "FlashInfer % ceiling",
                 "FlashInfer time / ours", "FlashInfer variant"])
        for r in rows:
            p = fi_peers.get((r["batch"], r["ctx"], r["hq"], r["hkv"])) if r["group"] == "shape" else None
            if not p:
                continue
            if "us" not in p:
                out.append(f"| {r['hq']}/{r['hkv']} | {r['batch']} | {r['ctx']} | {r['us']:.1f} | failed | - | - | "
                           f"{p.get('cuda_core', '')} {p.get('tc', '')} |")
                continue
            variant = "tensor cores" if p.get("tc_us") == p["us"] else "CUDA cores"
            out.append(f"| {r['hq']}/{r['hkv']} | {r['batch']} | {r['ctx']} | {r['us']:.1f} | {p['us']:.1f} | "
                       f"{100 * p['GBps'] / ceiling:.1f} | {p['us'] / r['us']:.2f} | {variant} |")
    heading(out, "HND vs NHD layout (same kernel, shuffled table)",
            ["KV", "heads q/kv", "batch", "context", "NHD us", "HND us", "HND % ceiling", "NHD time / HND"])
    for r, b in with_shape_row(rows, "hnd"):
        out.append(f"| {'fp8' if r['fp8'] else 'bf16'} | {r['hq']}/{r['hkv']} | {r['batch']} | {r['ctx']} | "
                   f"{b['us']:.1f} | {r['us']:.1f} | "
                   f"{r['pct']:.1f} | {b['us'] / r['us']:.2f} |")
    heading(out, "fp8 e4m3 KV vs bf16 KV (same shape, same kernel family; shuffled tables, and both over "
                 "engine-built tables with extents where measured)",
            ["heads q/kv", "batch", "context", "bf16 us", "fp8 us", "speed-up",
             "fp8 % ceiling (of fp8 bytes)", "speed-up, extents"])
    for r, b in with_shape_row(rows, "fp8"):
        ext = [find(rows, group="engine_extents", batch=r["batch"], ctx=r["ctx"], hkv=r["hkv"], fp8=f)
               for f in (0, 1)]
        on_extents = f"{ext[0]['us'] / ext[1]['us']:.2f}x" if all(ext) else "-"
        out.append(f"| {r['hq']}/{r['hkv']} | {r['batch']} | {r['ctx']} | {b['us']:.1f} | {r['us']:.1f} | "
                   f"{b['us'] / r['us']:.2f}x | {r['pct']:.1f} | {on_extents} |")
    heading(out, "Paging overhead: block tables in random order (shuffled), and as an engine's kv_cache_manager "
                 "builds them with a LIFO free list and with 2 MiB extents, against identity (contiguous) tables, "
                 "same kernel",
            ["heads q/kv", "batch", "context", "identity us", "shuffled us", "shuffled", "engine LIFO",
             "engine extents"])

    def overhead(group, r):
        t = find(rows, group=group, batch=r["batch"], ctx=r["ctx"], hkv=r["hkv"], fp8=0)
        return f"{100 * (t['us'] / r['us'] - 1):+.1f}%" if t else "-"

    for r, b in with_shape_row(rows, "identity"):
        out.append(f"| {r['hq']}/{r['hkv']} | {r['batch']} | {r['ctx']} | {r['us']:.1f} | {b['us']:.1f} | "
                   f"{100 * (b['us'] / r['us'] - 1):+.1f}% | {overhead('engine_lifo', r)} | "
                   f"{overhead('engine_extents', r)} |")
    heading(out, "ALiBi vs none (same kernel, shuffled table)",
            ["heads q/kv", "batch", "context", "without us", "ALiBi us", "ALiBi's cost"])
    for r, b in with_shape_row(rows, "alibi"):
        out.append(f"| {r['hq']}/{r['hkv']} | {r['batch']} | {r['ctx']} | {b['us']:.1f} | {r['us']:.1f} | "
                   f"{100 * (r['us'] / b['us'] - 1):+.1f}% |")
    heading(out, "Block size (GQA 32/8, batch 64, context 2048)",
            ["block size", "us", "% ceiling", "vs block 16"])
    ref = find(rows, group="block_size", bs=16)
    for r in rows:
        if r["group"] == "block_size":
            out.append(f"| {r['bs']} | {r['us']:.1f} | {r['pct']:.1f} | {100 * (r['us'] / ref['us'] - 1):+.1f}% |")
    heading(out, "head_dim (GQA 32/8, batch 64, context 2048)", ["head_dim", "heads q/kv", "us", "% ceiling"])
    for r in rows:
        if r["group"] == "head_dim":
            out.append(f"| {r['hd']} | {r['hq']}/{r['hkv']} | {r['us']:.1f} | {r['pct']:.1f} |")
    group_rows = [r for r in rows if r["group"] == "group"]
    if group_rows:
        heading(out, "The group at a fixed grid (512 units of 2048 tokens, extents tables)",
                ["heads q/kv", "batch", "group", "us", "% ceiling"])
    for r in group_rows:
        out.append(f"| {r['hq']}/{r['hkv']} | {r['batch']} | {r['hq'] // r['hkv']} | {r['us']:.1f} | {r['pct']:.1f} |")
    heading(out, "GQA ratio (32 query heads, batch 16, context 4096)",
            ["heads q/kv", "group", "us", "% ceiling"])
    for r in rows:
        if r["group"] == "gqa":
            out.append(f"| {r['hq']}/{r['hkv']} | {r['hq'] // r['hkv']} | {r['us']:.1f} | {r['pct']:.1f} |")
    heading(out, "Split-K: the planner's choice against caps (attention_params::max_splits)",
            ["heads q/kv", "batch", "context", "max_splits", "splits", "us", "% ceiling"])
    for r in rows:
        if r["group"] == "split_cap":
            cap = r.get("max_splits", 0)
            out.append(f"| {r['hq']}/{r['hkv']} | {r['batch']} | {r['ctx']} | {cap if cap else 'planner'} | "
                       f"{r['splits']} | {r['us']:.1f} | {r['pct']:.1f} |")
    print("\n".join(out))
    if args.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
        for ax, hkv in zip(axes, (32, 8)):
            for batch, color in zip((1, 16, 64, 256), ("C0", "C1", "C2", "C3")):
                mine = [r for r in rows if r["group"] == "shape" and r["hkv"] == hkv and r["batch"] == batch]
                ax.plot([r["ctx"] for r in mine], [r["pct"] for r in mine], "-o", color=color, label=f"pagedkv b={batch}")
                theirs = [(c, peers[(batch, c, 32, hkv)]) for c in (128, 512, 2048, 8192, 32768) if (batch, c, 32, hkv) in peers]
                ax.plot([c for c, _ in theirs], [100 * p["GBps"] / ceiling for _, p in theirs], "--x", color=color,
                        label=f"SDPA b={batch}")
                fis = [(c, fi_peers[(batch, c, 32, hkv)]) for c in (128, 512, 2048, 8192, 32768)
                       if (batch, c, 32, hkv) in fi_peers and "GBps" in fi_peers[(batch, c, 32, hkv)]]
                if fis:
                    ax.plot([c for c, _ in fis], [100 * p["GBps"] / ceiling for _, p in fis], ":+", color=color,
                            label=f"FlashInfer b={batch}")
            ax.set_xscale("log", base=2)
            ax.set_title(f"decode bf16, hd 128, heads 32/{hkv}")
            ax.set_xlabel("context (tokens)")
            ax.axhline(100, color="gray", lw=0.5)
            ax.grid(alpha=0.3)
        axes[0].set_ylabel("% of read-stream ceiling")
        axes[1].legend(fontsize=7, ncol=2)
        fig.tight_layout()
        fig.savefig(args.plot, dpi=110)


if __name__ == "__main__":
    main()
