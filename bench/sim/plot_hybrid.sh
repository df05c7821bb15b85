#!/usr/bin/env bash
# Turns pagedkv-sim --hybrid's hybrid_timeline.csv into docs/img/hybrid_window_freeing.png (gnuplot,
# Debian's gnuplot-nox): the blocks each group holds, step by step, window freeing off and on.
#   bench/sim/plot_hybrid.sh [CSV_DIR] [IMG_DIR]      defaults: build/sim-results docs/img
set -euo pipefail
csv_dir=${1:-build/sim-results}
img_dir=${2:-docs/img}
command -v gnuplot >/dev/null || { echo "plot_hybrid.sh: gnuplot not found (apt-get install gnuplot-nox)" >&2; exit 1; }
csv=$csv_dir/hybrid_timeline.csv
[[ -f $csv ]] || { echo "plot_hybrid.sh: no $csv (run pagedkv-sim --hybrid --out $csv_dir)" >&2; exit 1; }
mkdir -p "$img_dir"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for f in off on; do awk -F, -v f=$f 'NR > 1 && $1 == f {print $2 "," $3 "," $4 "," $5}' "$csv" > "$tmp/$f.csv"; done
gnuplot <<PLOT
set terminal pngcairo size 1200,560 font "DejaVu Sans,11" noenhanced
set output "$img_dir/hybrid_window_freeing.png"
set datafile separator ","
set key outside right top
set grid ytics lc rgb "#dddddd"
set title "Gemma-2-like model (full attention + sliding window 4096), prompts 8k-32k, fixed pool: blocks held per group"
set xlabel "step"
set ylabel "KV blocks held"
set y2label "running sequences"
set y2tics
plot "$tmp/off.csv" using 1:3 with lines lw 2 lc rgb "#1f77b4" title "full group, freeing off", \
     "$tmp/off.csv" using 1:2 with lines lw 2 lc rgb "#aec7e8" title "window group, freeing off", \
     "$tmp/on.csv" using 1:3 with lines lw 2 lc rgb "#d62728" title "full group, freeing on", \
     "$tmp/on.csv" using 1:2 with lines lw 2 lc rgb "#ff9896" title "window group, freeing on", \
     "$tmp/off.csv" using 1:4 axes x1y2 with lines dt 2 lc rgb "#1f77b4" title "running, freeing off", \
     "$tmp/on.csv" using 1:4 axes x1y2 with lines dt 2 lc rgb "#d62728" title "running, freeing on"
PLOT
echo "plot_hybrid.sh: wrote $img_dir/hybrid_window_freeing.png"
