#!/usr/bin/env bash
# Writes the shipped multi-turn traces with the simulator's generator (docs/simulation.md,
# "Generated traces"); the sim.shipped_traces_regenerate test checks they are what it writes.
#   bash bench/sim/traces/generate.sh [PAGEDKV_SIM] [OUT_DIR]
set -eu
here=$(cd "$(dirname "$0")" && pwd)
sim=${1:-$here/../../../build/release/bench/sim/pagedkv-sim}
out=${2:-$here}
"$sim" --workloads chat --sessions 150 --seed 1 --write-trace "$out/chat.jsonl"
"$sim" --workloads agentic --sessions 40 --seed 1 --write-trace "$out/agentic.jsonl"
