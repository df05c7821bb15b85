#!/usr/bin/env python3
"""Plots one prefill run: bench_prefill's shipped rows beside a peer measured in the same call
(FlashInfer's fa2 and fa3 from flashinfer_prefill_peer.py, or SDPA's flash and cuDNN from
prefill_peer.py), TFLOP/s per shape and head layout, with the cuBLASLt GEMM of the same run as a
line. Standard library + gnuplot (Debian's gnuplot-nox).

  plot_prefill.py BENCH_PREFILL.json PEER.json OUT.png
"""
import json
import os
import subprocess
import sys
import tempfile

SHAPE_NAMES = {0: "prompt_4k", 1: "prompt_16k", 2: "prompts_16x1k", 3: "chunk_512_over_8k"}
LABELS = {("prompt_4k", 1): "4k", ("prompt_16k", 1): "16k", ("prompts_16x1k", 16): "16x1k",
          ("chunk_512_over_8k", 1): "512/8k b1", ("chunk_512_over_8k", 8): "512/8k b8"}


def ours_and_gemm(path):
    rows, gemm = {}, None
    for b in json.load(open(path))["benchmarks"]:
        name = b["name"]
        if name.startswith("gemm_ceiling"):
            gemm = b["TFLOPs"]
            continue
        f = dict(p.split(":") for p in name.split("/")[1:] if ":" in p)
        if f.get("variant") == "0" and f.get("bs") == "16" and f.get("identity") == "0":
            rows[(SHAPE_NAMES[int(f["shape"])], int(f["batch"]), int(f["hkv"]))] = b["TFLOPs"]
    return rows, gemm


def main():
    bench_path, peer_path, out = sys.argv[1:4]
    ours, gemm = ours_and_gemm(bench_path)
    peer = json.load(open(peer_path))
    backends = [k for k in ("fa2", "fa3", "flash", "cudnn") if any(isinstance(r.get(k), dict) for r in peer["results"])]
    title = ("FlashInfer " + peer["flashinfer"]) if "flashinfer" in peer else ("PyTorch SDPA " + peer.get("torch", ""))
    lines = []
    for r in peer["results"]:
        key = (r["shape"], r["batch"], r["hkv"])
        if key not in ours:
            continue
        cells = [f"{r[b]['TFLOPs']:.1f}" if isinstance(r.get(b), dict) else "NaN" for b in backends]
        lines.append(f"\"{LABELS[(r['shape'], r['batch'])]} 32/{r['hkv']}\" {ours[key]:.1f} " + " ".join(cells))
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "prefill.dat")
        with open(data, "w") as f:
            f.write("\n".join(lines) + "\n")
        plots = [f"'{data}' using 2:xtic(1) title 'pagedkv'"]
        plots += [f"'' using {i + 3} title '{b}'" for i, b in enumerate(backends)]
        if gemm:
            plots.append(f"{gemm:.1f} with lines dashtype 2 lw 2 title 'cuBLASLt GEMM ({gemm:.0f})'")
        script = f"""set terminal pngcairo size 1100,520 font ',10' noenhanced
set output '{out}.tmp'
set style data histogram
set style histogram clustered gap 1
set style fill solid 0.85 border -1
set ylabel 'TFLOP/s (causal FLOPs)'
set yrange [0:*]
set xtics rotate by -30
set key top left
set grid ytics
set title 'Prefill, bf16 head_dim 128: pagedkv (pages of 16, shuffled) vs {title} (same run)'
plot {', '.join(plots)}
"""
        subprocess.run(["gnuplot"], input=script, text=True, check=True)
    os.replace(out + ".tmp", out)


if __name__ == "__main__":
    main()
