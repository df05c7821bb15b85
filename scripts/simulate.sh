#!/usr/bin/env bash
# The memory simulation (issue 3). Replays ShareGPT- and Alpaca-like traces through
# pagedkv's scheduler and through contiguous-reservation baselines at the same KV capacity, sweeps
# the block size, writes CSV to build/sim-results and PNG plots to build/sim-results/img, and
# prints the headline table. Extra arguments go to pagedkv-sim (see --help).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
[[ -x /usr/local/cuda/bin/nvcc ]] && export PATH="/usr/local/cuda/bin:$PATH"
cmake --preset release >/dev/null
cmake --build --preset release --target pagedkv-sim -j "$(nproc)"
out=build/sim-results
build/release/bench/sim/pagedkv-sim --out "$out" "$@"
bench/sim/plot.sh "$out" "$out/img"
echo
echo "KV utilization at saturation (live token slots / reserved slots) and throughput:"
awk -F, 'NR == 1 { for (i = 1; i <= NF; ++i) col[$i] = i; next }
         $col["workload"] == "sharegpt" && ($col["allocator"] == "first_fit" || $col["block_size"] == 16) {
           printf "  %-9s %-13s %-10s bs=%-4s utilization %5.1f%%  requests/step %.4f  preemptions %d\n",
                  $col["workload"], $col["system"], $col["allocator"], $col["block_size"],
                  100 * $col["kv_utilization"], $col["throughput_requests_per_step"], $col["preemptions"] }' \
    "$out/summary.csv"
echo "CSV: $out/summary.csv   plots: $out/img/*.png   (docs/simulation.md explains them)"
