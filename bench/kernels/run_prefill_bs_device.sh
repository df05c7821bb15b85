#!/usr/bin/env bash
# Helper bs's device call (session 5, docs/journal/prefill-kernel.md): the prefill tests with
# memcheck and racecheck (run_prefill_ws_device.sh's; every bf16 wgmma case also on the copier
# variants 1-3 of prefill_ws_variant), then bench_prefill's shipped body (variant 0) against
# block size 16's candidates (5: the boxes spread over the copier's four warps, 6: three stages,
# 8: both) on the 4k prompt at block sizes 1, 16, 64 and 256 and the other issue-21 shapes at 16,
# twice each in random interleaved order. Run from a folder holding the four binaries, this script,
# run_prefill_ws_device.sh and libbenchmark; logs to $OUT: ws-tests.log, bench_prefill.json,
# bench_prefill.log. The script of run bs-1 (docs/benchmarks.md): its variants 5, 6 and 8 are in
# commit e78315c's bench_prefill; 5 shipped in 7d8c853, 6 and 8 removed there.
set -u
bin=$(cd "${1:-.}" && pwd) || exit 1
BENCH_FILTER='gemm_ceiling' BENCH_TIMEOUT=30 bash "$bin/run_prefill_ws_device.sh" "$bin" || exit 1
cd "$bin" && export LD_LIBRARY_PATH=$bin
timeout "${BENCH_TIMEOUT:-80}" ./bench_prefill --benchmark_filter='prefill/.*identity:0/variant:[0568]/' \
  --benchmark_repetitions=2 --benchmark_enable_random_interleaving=true --benchmark_out="$OUT/bench_prefill.json" \
  --benchmark_out_format=json --benchmark_counters_tabular=true > "$OUT/bench_prefill.log" 2>&1
echo "bench_prefill rc=$? after ${SECONDS}s"; date -u
python3 - "$OUT/bench_prefill.json" <<'PY'
import json, sys, re, statistics
rows = {}
for b in json.load(open(sys.argv[1]))["benchmarks"]:
    if not b["name"].startswith("prefill/") or b.get("run_type") != "iteration": continue
    a = dict(re.findall(r"(\w+):(\d+)", b["name"]))
    r = rows.setdefault((int(a["shape"]), int(a["batch"]), -int(a["hkv"]), int(a["bs"])), {})
    r.setdefault(a["variant"], []).append((b["TFLOPs"], b.get("max_diff_vs_shipped", 0.0)))
print("shape batch hkv bs | v0 runs | v5 runs | v6 runs | v8 runs | v5/v0 v6/v0 v8/v0 (means) | max_diff")
for k, v in sorted(rows.items()):
    base = statistics.mean(x for x, _ in v.get("0", [(float("nan"), 0)]))
    cells, ratios = [], []
    for var in "0568":
        runs = [x for x, _ in v.get(var, [])]
        cells.append(" ".join(f"{x:.1f}" for x in runs) or "-")
        if var != "0": ratios.append(f"{statistics.mean(runs) / base:.3f}" if runs else "-")
    diff = max((d for var in v.values() for _, d in var), default=0.0)
    print(k[0], k[1], -k[2], k[3], "|", " | ".join(cells), "|", " ".join(ratios), "|", diff)
print("4k prompt, block size 16 over 64 and over 256 (means), by variant")
for hkv in (32, 8):
    for var in "0568":
        m = {bs: statistics.mean(x for x, _ in rows[(0, 1, -hkv, bs)][var]) for bs in (16, 64, 256)
             if var in rows.get((0, 1, -hkv, bs), {})}
        if len(m) == 3: print(f"hkv {hkv} variant {var}: 16/64 {m[16] / m[64]:.3f} 16/256 {m[16] / m[256]:.3f}")
PY
