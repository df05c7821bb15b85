#!/usr/bin/env python3
"""The GPU engine's two plots for docs/benchmarks.md, with gnuplot (Debian's gnuplot-nox).

    bench/engine/plot.py OUT_DIR LABEL=ENGINE_LOG[@HF_JSON] ...

Each argument names a bar: the pagedkv-llama --bench output it reads (output tokens/s, the mean
decode step and its roofline) and, after @, the transformers peer's JSON (hf_peer.py) on the
same requests. Writes OUT_DIR/engine_throughput.png (output tokens/s, pagedkv against the peer),
OUT_DIR/engine_decode_roofline.png (mean decode step against its roofline) and
OUT_DIR/engine_decode_buckets.png (decode step / roofline by batch bucket, from the "decode batch"
lines)."""
import json
import os
import re
import subprocess
import sys
import tempfile


def engine_figures(path):
    text = open(path).read()
    tok = re.search(r"output tokens/s\s+([\d.]+)", text)
    step = re.search(r"decode step\s+mean ([\d.]+) ms", text)
    roof = re.search(r"decode roofline\s+([\d.]+) ms", text)
    if not (tok and step and roof):
        sys.exit(f"plot.py: {path} has no --bench output with a decode roofline")
    return float(tok.group(1)), float(step.group(1)), float(roof.group(1))


def bucket_ratios(path):
    """{bucket: step / roofline} from the "decode batch" lines (the first run's, in a log of several)."""
    ratios = {}
    for bucket, ratio in re.findall(r"decode batch (\S+)\s+[\d.]+ ms over \d+ steps .*: ([\d.]+)x", open(path).read()):
        ratios.setdefault(bucket, float(ratio))
    return ratios


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    out_dir = sys.argv[1]
    rows = []
    buckets = []
    for arg in sys.argv[2:]:
        label, _, files = arg.partition("=")
        log, _, hf = files.partition("@")
        tok, step, roof = engine_figures(log)
        peer = json.load(open(hf))["output_tokens_per_s"] if hf else 0.0
        rows.append((label, tok, peer, step, roof))
        if ratios := bucket_ratios(log):  # logs from before the buckets were printed have none
            buckets.append((label, ratios))
    os.makedirs(out_dir, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "rows.dat")
        with open(data, "w") as f:
            for label, tok, peer, step, roof in rows:
                f.write(f'"{label}" {tok} {peer} {step} {roof}\n')
        names = ["64-95", "96-127", "128-191", "192+"]
        bucket_data = os.path.join(tmp, "buckets.dat")
        with open(bucket_data, "w") as f:
            for name in names:
                f.write(f'"{name}" ' + " ".join(str(r.get(name, "NaN")) for _, r in buckets) + "\n")
        series = ", ".join(f'"{bucket_data}" using {i + 2}{":xtic(1)" if i == 0 else ""} title "{label}"'
                           for i, (label, _) in enumerate(buckets))
        script = f"""
set terminal pngcairo size 900,420 font ",11"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set grid ytics
set key top left
set xtics noenhanced
set output "{out_dir}/engine_throughput.png"
set title "256 ShareGPT-like requests at t=0: output tokens/s"
set ylabel "output tokens/s"
plot "{data}" using 2:xtic(1) title "pagedkv-llama --device cuda", "" using 3 title "transformers continuous batching"
set output "{out_dir}/engine_decode_roofline.png"
set title "mean decode step (batch >= 64) against its roofline"
set ylabel "ms"
plot "{data}" using 4:xtic(1) title "decode step", "" using 5 title "roofline (weights + KV bytes / read ceiling)"
{"" if buckets else "exit"}
set output "{out_dir}/engine_decode_buckets.png"
set title "decode step / roofline by batch size (1.25x: issue 20's target)"
set ylabel "step / roofline"
set xlabel "sequences in the step"
set yrange [1:*]
plot {series}, 1.25 with lines dashtype 2 lc rgb "black" title "target"
"""
        subprocess.run(["gnuplot"], input=script, text=True, check=True)
    for label, tok, peer, step, roof in rows:
        ratio = f", {tok / peer:.1f}x the peer" if peer else ""
        print(f"{label}: {tok:.0f} tok/s{ratio}; decode step {step:.2f} ms, {step / roof:.2f}x its roofline")


if __name__ == "__main__":
    main()
