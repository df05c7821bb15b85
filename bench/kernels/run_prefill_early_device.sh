#!/usr/bin/env bash
# ws3b's second device call (session 5): the prefill tests, memcheck and racecheck
# (run_prefill_ws_device.sh's, every bf16 wgmma case also on variant 6's kernel), then
# bench_prefill's shipped body (0) against variant 6 (the copier's first block ids read ahead) on
# every issue-21 shape, twice each in random interleaved order (Google Benchmark
# --benchmark_enable_random_interleaving). Run from a folder holding the four binaries and
# libbenchmark; logs to $OUT: ws-tests.log, bench_prefill.json, bench_prefill.log.
set -u
bin=$(cd "${1:-.}" && pwd) || exit 1
BENCH_FILTER='gemm_ceiling' BENCH_TIMEOUT=30 bash "$bin/run_prefill_ws_device.sh" "$bin" || exit 1
cd "$bin" && export LD_LIBRARY_PATH=$bin
timeout 110 ./bench_prefill --benchmark_filter='prefill/.*identity:0/variant:[06]/' --benchmark_repetitions=2 \
  --benchmark_enable_random_interleaving=true --benchmark_out="$OUT/bench_prefill.json" --benchmark_out_format=json \
  --benchmark_counters_tabular=true > "$OUT/bench_prefill.log" 2>&1
echo "bench_prefill rc=$? after ${SECONDS}s"; date -u
python3 - "$OUT/bench_prefill.json" <<'PY'
import json, sys, re, statistics
rows = {}
for b in json.load(open(sys.argv[1]))["benchmarks"]:
    if not b["name"].startswith("prefill/") or b.get("run_type") != "iteration": continue
    a = dict(re.findall(r"(\w+):(\d+)", b["name"]))
    rows.setdefault((a["shape"], a["batch"], a["hkv"], a["bs"]), {}).setdefault(a["variant"], []).append(b["TFLOPs"])
print("shape batch hkv bs | v0 runs | v6 runs | v6/v0 (means)")
for k, v in sorted(rows.items()):
    if "0" in v and "6" in v:
        print(*k, "|", *(round(x, 1) for x in v["0"]), "|", *(round(x, 1) for x in v["6"]), "|",
              round(statistics.mean(v["6"]) / statistics.mean(v["0"]), 3))
PY
