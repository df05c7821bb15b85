#!/usr/bin/env bash
# The host-tier measurement of issue 23 (docs/simulation.md, "A host tier under the device cache"):
# runs pagedkv-sim on the shipped chat and agentic traces with host tiers of 0, 1 and 4 times the
# device pool under LRU, TinyLFU and TTL eviction, and plots the prompt tokens recomputed (gnuplot,
# Debian's gnuplot-nox).
#   bench/sim/plot_tiers.sh [PAGEDKV_SIM] [OUT_DIR] [IMG_DIR]
#   defaults: build/release/bench/sim/pagedkv-sim build/sim-tiers docs/img
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
sim=${1:-build/release/bench/sim/pagedkv-sim}
out=${2:-build/sim-tiers}
img_dir=${3:-docs/img}
command -v gnuplot >/dev/null || { echo "plot_tiers.sh: gnuplot not found (apt-get install gnuplot-nox)" >&2; exit 1; }
mkdir -p "$out" "$img_dir"

# chat: 16384 slots hold half of the sessions' 36k tokens of history; agentic: 8192 slots, so that
# the 2048-token tool prompt and a few tasks' branches fit but not every task's.
run() {  # name trace capacity
  "$sim" --trace "$here/traces/$2" --block-sizes 16 --capacities "$3" --host-tiers 0,1,4 \
    --evictions lru,tinylfu,ttl --ttl-steps 1000 --quiet --out "$out/$1" | tee "$out/$1.txt"
}
run chat chat.jsonl 16384
run agentic agentic.jsonl 8192

# Per trace: rows "ratio,lru,tinylfu,ttl" of recomputed prompt tokens, % of LRU without a tier.
tables() {  # name
  local csv=$out/$1/trace_sweep.csv
  awk -F, '
    NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; next }
    { ratio = ($c["host_tier_blocks"] == 0) ? 0 : $c["host_tier_blocks"] / $c["num_blocks"]
      r[ratio "," $c["eviction"]] = $c["recomputed_prompt_tokens"]; ratios[ratio] = 1 }
    END {
      for (x in ratios) {
        printf "%g,%f,%f,%f\n", x, 100 * r[x ",lru"] / r["0,lru"], 100 * r[x ",tinylfu"] / r["0,lru"],
               100 * r[x ",ttl"] / r["0,lru"]
      }
    }' "$csv" | sort -t, -k1,1n
}
tables chat > "$out/chat_bars.csv"
tables agentic > "$out/agentic_bars.csv"

gnuplot <<EOF
set terminal pngcairo size 1200,520 font "DejaVu Sans,11" noenhanced
set output "$img_dir/host_tier.png"
set datafile separator ","
set multiplot layout 1,2 title "Prompt tokens recomputed with a host tier (block 16; % of LRU without a tier)" margins 0.07,0.97,0.12,0.85 spacing 0.08
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.9 border rgb "#333333"
set boxwidth 0.9
set yrange [0:115]
set ylabel "% of prompt tokens recomputed without a tier"
set xlabel "host tier, x the device pool"
set grid ytics lc rgb "#dddddd"
set key top right
set xtics scale 0
set title "chat (150 sessions, 16384 device slots)"
plot "$out/chat_bars.csv" using 2:xtic(stringcolumn(1)."x") title "LRU" lc rgb "#2b8cbe", \
     "" using 3 title "TinyLFU" lc rgb "#fdae6b", \
     "" using 4 title "TTL 1000 steps" lc rgb "#74c476", \
     "" using (\$0 - 0.3):(\$2 + 4):(sprintf("%.0f%%", \$2)) with labels notitle
set title "agentic (40 tasks, 8192 device slots)"
plot "$out/agentic_bars.csv" using 2:xtic(stringcolumn(1)."x") title "LRU" lc rgb "#2b8cbe", \
     "" using 3 title "TinyLFU" lc rgb "#fdae6b", \
     "" using 4 title "TTL 1000 steps" lc rgb "#74c476", \
     "" using (\$0 - 0.3):(\$2 + 4):(sprintf("%.0f%%", \$2)) with labels notitle
unset multiplot
EOF
echo "plot_tiers.sh: wrote $img_dir/host_tier.png; tables in $out/{chat,agentic}.txt"
