#!/usr/bin/env bash
# Turns pagedkv-sim's CSV into the PNGs of docs/simulation.md (gnuplot, Debian's gnuplot-nox).
#   bench/sim/plot.sh [CSV_DIR] [IMG_DIR]      defaults: build/sim-results docs/img
# Plots that need paged rows (block-size sweep, sharing savings) are skipped while there are none.
set -euo pipefail
csv_dir=${1:-build/sim-results}
img_dir=${2:-docs/img}
command -v gnuplot >/dev/null || { echo "plot.sh: gnuplot not found (apt-get install gnuplot-nox)" >&2; exit 1; }
[[ -f $csv_dir/summary.csv ]] || { echo "plot.sh: no $csv_dir/summary.csv (run pagedkv-sim --out $csv_dir)" >&2; exit 1; }
mkdir -p "$img_dir"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# summary.csv columns by name, so the awk below survives new columns.
col() { head -1 "$csv_dir/summary.csv" | tr ',' '\n' | grep -nx "$1" | cut -d: -f1; }
c_workload=$(col workload); c_system=$(col system); c_alloc=$(col allocator); c_bs=$(col block_size)
c_live=$(col live_fraction); c_future=$(col future_fraction); c_internal=$(col internal_fraction)
c_external=$(col external_fraction); c_idle=$(col idle_fraction); c_util=$(col kv_utilization)
c_tput=$(col throughput_requests_per_step); c_running=$(col mean_running_sequences)
c_saving=$(col sharing_saving)

# Display names: contiguous systems as in the paper's Fig. 2, paged with its block size. The main
# plots show the issue's baselines (first-fit placement; Pow2 = next power of two of the total) and
# paged at block size 16; paper_comparison.png adds buddy placement with the paper's Pow2.
label_awk='function label(sys, bs) {
  if (sys == "max_length") return "Max";
  if (sys == "power_of_two") return "Pow2";
  if (sys == "exact") return "Oracle";
  if (sys == "pow2_output") return "Pow2 (output)";
  return "Paged bs=" bs;
}
function main_row(sys, alloc, bs) {
  if (sys == "paged") return bs == 16;
  return alloc == "first_fit" && sys != "pow2_output";
}'

common='set terminal pngcairo size 1200,560 font "DejaVu Sans,11" noenhanced
set datafile separator ","
set key outside right top
set grid ytics lc rgb "#dddddd"
set border 3
set tics nomirror'

# ---- 1. memory breakdown at saturation: the paper's Fig. 2, per dataset ----
# Contiguous systems plus paged at block size 16 when present.
for w in sharegpt alpaca; do
  awk -F, -v w="$w" -v cw="$c_workload" -v cs="$c_system" -v ca="$c_alloc" -v cb="$c_bs" -v l="$c_live" \
      -v f="$c_future" -v i="$c_internal" -v e="$c_external" -v d="$c_idle" "$label_awk"'
    NR > 1 && $cw == w && main_row($cs, $ca, $cb) {
      order = ($cs == "max_length") ? 1 : ($cs == "power_of_two") ? 2 : ($cs == "exact") ? 3 : 4
      printf "%d,%s,%f,%f,%f,%f,%f\n", order, label($cs, $cb), 100*$l, 100*$f, 100*$i, 100*$e, 100*$d
    }' "$csv_dir/summary.csv" | sort -t, -k1,1n > "$tmp/breakdown_$w.csv"
done
gnuplot <<EOF
$common
set output "$img_dir/memory_breakdown.png"
set multiplot layout 1,2 title "KV memory at saturation (time-averaged % of capacity, 16384 token slots)" margins 0.06,0.78,0.1,0.88 spacing 0.07
set style data histograms
set style histogram rowstacked
set style fill solid 0.9 border rgb "#333333"
set boxwidth 0.6
set yrange [0:100]
set ylabel "% of KV capacity"
set key off
set xtics scale 0
set title "ShareGPT-like"
plot "$tmp/breakdown_sharegpt.csv" using 3:xtic(2) title "token states" lc rgb "#2b8cbe", \
     "" using 4 title "reserved for future tokens" lc rgb "#a6bddb", \
     "" using 5 title "internal fragmentation" lc rgb "#fdae6b", \
     "" using 6 title "external fragmentation" lc rgb "#e6550d", \
     "" using 7 title "free (idle)" lc rgb "#eeeeee", \
     "" using 0:(\$3 > 90 ? \$3 - 5 : \$3 + 4):(sprintf("%.1f%%", \$3)) with labels notitle
set key at screen 0.99,0.85 right top
set title "Alpaca-like"
plot "$tmp/breakdown_alpaca.csv" using 3:xtic(2) title "token states" lc rgb "#2b8cbe", \
     "" using 4 title "reserved for future tokens" lc rgb "#a6bddb", \
     "" using 5 title "internal fragmentation" lc rgb "#fdae6b", \
     "" using 6 title "external fragmentation" lc rgb "#e6550d", \
     "" using 7 title "free (idle)" lc rgb "#eeeeee", \
     "" using 0:(\$3 > 90 ? \$3 - 5 : \$3 + 4):(sprintf("%.1f%%", \$3)) with labels notitle
unset multiplot
EOF

# ---- 2. throughput and concurrency per workload and system ----
systems=$(awk -F, -v cs="$c_system" -v ca="$c_alloc" -v cb="$c_bs" "$label_awk"'
  NR > 1 && main_row($cs, $ca, $cb) { print label($cs, $cb) }' "$csv_dir/summary.csv" | awk '!seen[$0]++')
awk -F, -v cw="$c_workload" -v cs="$c_system" -v ca="$c_alloc" -v cb="$c_bs" -v t="$c_tput" -v r="$c_running" "$label_awk"'
  NR > 1 && main_row($cs, $ca, $cb) {
    w = $cw; s = label($cs, $cb)
    if (!(w in seen)) { seen[w] = 1; order[++n] = w }
    if (!(s in sseen)) { sseen[s] = 1; sorder[++m] = s }
    tput[w, s] = $t; run[w, s] = $r
  }
  END {
    for (k = 1; k <= n; ++k) {
      line = order[k]; line2 = order[k]
      for (j = 1; j <= m; ++j) { line = line "," tput[order[k], sorder[j]]; line2 = line2 "," run[order[k], sorder[j]] }
      print line > "'"$tmp"'/throughput.csv"; print line2 > "'"$tmp"'/running.csv"
    }
  }' "$csv_dir/summary.csv"
nsys=$(echo "$systems" | wc -l)
plot_cols() {  # $1 file: one clustered bar per system
  local i=0 out=""
  while IFS= read -r s; do
    i=$((i + 1))
    [[ -n $out ]] && out+=", "
    if ((i == 1)); then out+="\"$1\" using $((i + 1)):xtic(1) title \"$s\""; else out+="\"\" using $((i + 1)) title \"$s\""; fi
  done <<< "$systems"
  echo "$out"
}
gnuplot <<EOF
$common
set terminal pngcairo size 1400,560 font "DejaVu Sans,11" noenhanced
set output "$img_dir/throughput.png"
set multiplot layout 1,2 title "Same trace, same KV capacity: how much each allocation scheme lets run"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.85 border rgb "#333333"
set xtics rotate by -35 scale 0
set logscale y
set rmargin 6
set bmargin 7
set key inside top right
set title "throughput (requests finished per step, log scale)"
plot $(plot_cols "$tmp/throughput.csv")
set title "mean running sequences (log scale)"
set yrange [1:1000]
plot $(plot_cols "$tmp/running.csv")
unset multiplot
EOF

# ---- 2b. against the paper's Fig. 2: share of KV memory holding token states, ShareGPT ----
# Paper: Orca Max 20.4%, Pow2 26.8%, Oracle 38.2%, vLLM 96.3% (Kwon et al., SOSP 2023, Fig. 2).
# Ours twice: the issue's baselines on first-fit, and the paper's setup (buddy placement, Pow2 =
# prompt + next power of two of the output).
awk -F, -v cw="$c_workload" -v cs="$c_system" -v ca="$c_alloc" -v cb="$c_bs" -v l="$c_live" '
  NR > 1 && $cw == "sharegpt" { v[$cs "/" $ca "/" $cb] = 100 * $l }
  function get(key) { return (key in v) ? v[key] : "NaN" }
  END {
    print "Max,20.4," get("max_length/first_fit/0") "," get("max_length/buddy/0")
    print "Pow2,26.8," get("power_of_two/first_fit/0") "," get("pow2_output/buddy/0")
    print "Oracle,38.2," get("exact/first_fit/0") "," get("exact/buddy/0")
    if ("paged/blocks/16" in v) print "Paged (bs 16),96.3," v["paged/blocks/16"] "," v["paged/blocks/16"]
  }' "$csv_dir/summary.csv" > "$tmp/paper.csv"
gnuplot <<EOF
$common
set terminal pngcairo size 1000,520 font "DejaVu Sans,11" noenhanced
set output "$img_dir/paper_comparison.png"
set title "Share of KV memory holding token states, ShareGPT-like at saturation, vs the paper's Fig. 2"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.85 border rgb "#333333"
set datafile missing "NaN"
set yrange [0:110]
set ylabel "% of KV capacity"
set xtics scale 0
set key inside top left
plot "$tmp/paper.csv" using 2:xtic(1) title "paper (OPT-13B, A100, ShareGPT)" lc rgb "#999999", \
     "" using 3 title "ours, first-fit; Pow2 = 2^ceil(prompt+output)" lc rgb "#2b8cbe", \
     "" using 4 title "ours, buddy; Pow2 = prompt + 2^ceil(output) (paper's setup)" lc rgb "#e6550d", \
     "" using (\$0 - 0.27):(\$2 + 3):(sprintf("%.1f", \$2)) with labels notitle, \
     "" using (\$0):(\$3 + 3):(sprintf("%.1f", \$3)) with labels notitle, \
     "" using (\$0 + 0.27):(\$4 + 3):(sprintf("%.1f", \$4)) with labels notitle
EOF

# ---- 2c. memory over time for the first workload (timeline.csv) ----
if [[ -f $csv_dir/timeline.csv ]]; then
  for system in max_length power_of_two exact; do
    awk -F, -v s="$system" 'NR > 1 && $1 == s { print $2 "," 100 * $3 "," 100 * $4 "," $6 }' \
      "$csv_dir/timeline.csv" > "$tmp/timeline_$system.csv"
  done
  gnuplot <<EOF
$common
set terminal pngcairo size 1200,520 font "DejaVu Sans,11" noenhanced
set output "$img_dir/timeline.png"
set title "First workload (default ShareGPT-like, all requests at step 0): KV memory over time, means per 500 steps"
set xlabel "step"
set ylabel "% of KV capacity"
set yrange [0:105]
set key outside right top
plot "$tmp/timeline_max_length.csv" using 1:2 with lines lw 2 lc rgb "#7b3294" title "Max: token states", \
     "" using 1:3 with lines lw 1.5 dt 2 lc rgb "#7b3294" title "Max: reserved", \
     "$tmp/timeline_power_of_two.csv" using 1:2 with lines lw 2 lc rgb "#1b9e77" title "Pow2: token states", \
     "" using 1:3 with lines lw 1.5 dt 2 lc rgb "#1b9e77" title "Pow2: reserved", \
     "$tmp/timeline_exact.csv" using 1:2 with lines lw 2 lc rgb "#2b8cbe" title "Oracle: token states", \
     "" using 1:3 with lines lw 1.5 dt 2 lc rgb "#2b8cbe" title "Oracle: reserved"
EOF
fi

# ---- 3. the synthetic length distributions (compare with the paper's Fig. 11) ----
gnuplot <<EOF
$common
set output "$img_dir/lengths.png"
set multiplot layout 1,2 title "Synthetic request lengths (100k draws; clamped log-normals fitted to the paper's means)"
set key top right inside
set xlabel "tokens"
set ylabel "density"
set style fill transparent solid 0.45 noborder
set xrange [0:2100]
set title "ShareGPT-like (mean in 161, out 338)"
plot "$csv_dir/lengths_sharegpt.csv" using 1:2 every ::1 with boxes lc rgb "#2b8cbe" title "input", \
     "" using 1:3 every ::1 with boxes lc rgb "#e6550d" title "output"
set xrange [0:400]
set title "Alpaca-like (mean in 19, out 58)"
plot "$csv_dir/lengths_alpaca.csv" using 1:2 every ::1 with boxes lc rgb "#2b8cbe" title "input", \
     "" using 1:3 every ::1 with boxes lc rgb "#e6550d" title "output"
unset multiplot
EOF

# ---- 4. the beam model: how much of a beam group's output is shared ----
if [[ -f $csv_dir/beam_model.csv ]]; then
  for width in 2 4 6; do
    awk -F, -v k="$width" 'NR > 1 && $1 == k { print $2 "," 100 * $6 }' "$csv_dir/beam_model.csv" > "$tmp/beam_$width.csv"
  done
  gnuplot <<EOF
$common
set terminal pngcairo size 800,500 font "DejaVu Sans,11" noenhanced
set output "$img_dir/beam_model.png"
set title "Beam model: output tokens shared between live beams (block size 1, after N steps)"
set xlabel "decoding steps"
set ylabel "% of k x N output tokens shared"
set logscale x 2
set yrange [0:100]
set key bottom right inside
plot "$tmp/beam_2.csv" using 1:2 with linespoints lw 2 title "k = 2", \
     "$tmp/beam_4.csv" using 1:2 with linespoints lw 2 title "k = 4", \
     "$tmp/beam_6.csv" using 1:2 with linespoints lw 2 title "k = 6"
EOF
fi

# ---- 5. paged: the block-size sweep and sharing savings (only with paged rows) ----
if awk -F, -v cs="$c_system" 'NR > 1 && $cs == "paged" { found = 1 } END { exit !found }' "$csv_dir/summary.csv"; then
  for w in sharegpt alpaca; do
    awk -F, -v w="$w" -v cw="$c_workload" -v cs="$c_system" -v cb="$c_bs" -v u="$c_util" -v i="$c_internal" \
        -v t="$c_tput" 'NR > 1 && $cw == w && $cs == "paged" { print $cb "," 100 * $u "," 100 * $i "," $t }' \
        "$csv_dir/summary.csv" | sort -t, -k1,1n > "$tmp/sweep_$w.csv"
  done
  gnuplot <<EOF
$common
set output "$img_dir/block_size_sweep.png"
set multiplot layout 1,2 title "Paged: block size trade-off at saturation"
set logscale x 2
set xlabel "block size (tokens)"
set key bottom left inside
set title "KV utilization (live / allocated) and internal fragmentation"
set ylabel "%"
set yrange [0:100]
plot "$tmp/sweep_sharegpt.csv" using 1:2 with linespoints lw 2 title "utilization, ShareGPT-like", \
     "$tmp/sweep_alpaca.csv" using 1:2 with linespoints lw 2 title "utilization, Alpaca-like", \
     "$tmp/sweep_sharegpt.csv" using 1:3 with linespoints dt 2 lw 2 title "internal frag., ShareGPT-like", \
     "$tmp/sweep_alpaca.csv" using 1:3 with linespoints dt 2 lw 2 title "internal frag., Alpaca-like"
set title "throughput (requests per step)"
set ylabel "requests / step"
set autoscale y
set key top right inside
plot "$tmp/sweep_sharegpt.csv" using 1:4 with linespoints lw 2 title "ShareGPT-like", \
     "$tmp/sweep_alpaca.csv" using 1:4 with linespoints lw 2 title "Alpaca-like"
unset multiplot
EOF
  awk -F, -v cw="$c_workload" -v cs="$c_system" -v cb="$c_bs" -v sv="$c_saving" '
    NR > 1 && $cs == "paged" && $cb == 16 && ($cw ~ /-parallel-|-beam-/) { print $cw "," 100 * $sv }' \
    "$csv_dir/summary.csv" > "$tmp/sharing.csv"
  if [[ -s $tmp/sharing.csv ]]; then
    gnuplot <<EOF
$common
set terminal pngcairo size 900,500 font "DejaVu Sans,11" noenhanced
set output "$img_dir/sharing_savings.png"
set title "Paged (block size 16): KV memory saved by sharing, vs the same sequences unshared"
set style data histograms
set style fill solid 0.85 border rgb "#333333"
set boxwidth 0.6
set ylabel "% memory saved"
set yrange [0:100]
set xtics rotate by -30 scale 0
set bmargin 6
set key off
set label 1 "paper (OPT-13B, Alpaca): parallel sampling 6.1-9.8%, beam search 37.6-55.2%" at graph 0.02, graph 0.95
plot "$tmp/sharing.csv" using 2:xtic(1) lc rgb "#2b8cbe", "" using 0:(\$2 + 3):(sprintf("%.1f%%", \$2)) with labels
EOF
  fi
fi
echo "plot.sh: wrote $(ls "$img_dir"/*.png | tr '\n' ' ')"
