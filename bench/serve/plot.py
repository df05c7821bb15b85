#!/usr/bin/env python3
"""sweep.sh's reports as docs/benchmarks.md's serving plot, with gnuplot (Debian's gnuplot-nox).

    bench/serve/plot.py SWEEP_DIR OUT.png

Reads SWEEP_DIR/caching-{on,off}-rate-RATE.json (bench_serve.py's reports) and draws TTFT and TPOT
(p50 as lines, p99 dashed) against the offered rate, prefix caching on and off, side by side."""
import glob
import json
import os
import re
import subprocess
import sys
import tempfile


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    sweep, out = sys.argv[1], sys.argv[2]
    rows = {"on": [], "off": []}
    for path in glob.glob(os.path.join(sweep, "caching-*-rate-*.json")):
        caching, rate = re.search(r"caching-(on|off)-rate-([\d.]+)\.json$", path).groups()
        r = json.load(open(path))
        rows[caching].append((float(rate), r["ttft_ms"]["p50"], r["ttft_ms"]["p99"], r["tpot_ms"]["p50"],
                              r["tpot_ms"]["p99"]))
    if not rows["on"] or not rows["off"]:
        sys.exit(f"plot.py: {sweep} lacks reports with prefix caching on and off")
    with tempfile.TemporaryDirectory() as tmp:
        data = {}
        for caching, points in rows.items():
            data[caching] = os.path.join(tmp, f"{caching}.dat")
            with open(data[caching], "w") as f:
                for p in sorted(points):
                    f.write(" ".join(f"{v / 1000 if i else v}" for i, v in enumerate(p)) + "\n")  # ms -> s

        def panel(title, p50, p99):
            return f"""
set title "{title}"
plot "{data['on']}" using 1:{p50} with linespoints lw 2 pt 7 lc rgb "#1f77b4" title "caching on, p50", \\
     "{data['on']}" using 1:{p99} with linespoints lw 1 pt 6 dt 2 lc rgb "#1f77b4" title "caching on, p99", \\
     "{data['off']}" using 1:{p50} with linespoints lw 2 pt 5 lc rgb "#d62728" title "caching off, p50", \\
     "{data['off']}" using 1:{p99} with linespoints lw 1 pt 4 dt 2 lc rgb "#d62728" title "caching off, p99"
"""
        script = f"""
set terminal pngcairo size 1000,460 font ",11"
set output "{out}"
set multiplot layout 1,2
set grid
set key below maxrows 2 width 2
set xlabel "offered rate (requests/s)"
set ylabel "seconds"
set logscale x 2
set xtics (0.5, 1, 2)
set yrange [0:*]
{panel("time to first token", 2, 3)}
{panel("time per output token", 4, 5)}
unset multiplot
"""
        subprocess.run(["gnuplot"], input=script, text=True, check=True)
    print(f"plot.py: wrote {out}")


if __name__ == "__main__":
    main()
