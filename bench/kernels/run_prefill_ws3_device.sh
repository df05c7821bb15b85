#!/usr/bin/env bash
# ws3's device call (session 5, issue 21): the persistent wgmma prefill (bench_prefill variant 5)
# against the shipped body (variant 0) and the peers, from the repository root, carrying
# build/dev-ws3 and build/fi-peer. Tests first (the full sweep's test_prefill_cuda in 8 shards,
# the default build's in 4, test_prefill_plan, test_attention_step_cuda, memcheck and racecheck on
# the small case), FlashInfer's JIT warm-up beside them; once they pass, bench_prefill (variants 0
# and 5), SDPA (prefill_peer.py), the report, FlashInfer fa2/fa3. Logs to $OUT.
set -u; export OUT
root=$PWD; scripts=$root/bench/kernels; bin=$root/build/dev-ws3/bin; logs=/tmp/ws3-logs
export PYTHONUNBUFFERED=1 MAX_JOBS=16 LD_LIBRARY_PATH=$bin
mkdir -p "$logs" /tmp/fi && tar xJf build/fi-peer/site.tar.xz -C /tmp/fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv; date -u
( cd "$scripts" && for b in fa2 fa3; do
    { LD_LIBRARY_PATH= PYTHONPATH=/tmp/fi/site timeout 150 python3 flashinfer_prefill_peer.py --warm --backends $b; echo "warm $b rc=$?"; } > /tmp/warm_$b.log 2>&1 &
  done; wait ) &
warm=$!
cd "$bin"
for i in $(seq 0 7); do
  { GTEST_TOTAL_SHARDS=8 GTEST_SHARD_INDEX=$i timeout 170 ./test_prefill_cuda_full; echo "full sweep shard $i rc=$?"; } > "$logs/full.$i.log" 2>&1 &
done
for i in $(seq 0 3); do
  { GTEST_TOTAL_SHARDS=4 GTEST_SHARD_INDEX=$i timeout 170 ./test_prefill_cuda; echo "default shard $i rc=$?"; } > "$logs/default.$i.log" 2>&1 &
done
{ timeout 60 ./test_prefill_plan; echo "test_prefill_plan rc=$?"; } > "$logs/plan.log" 2>&1 &
{ timeout 170 ./test_attention_step_cuda; echo "test_attention_step_cuda rc=$?"; } > "$logs/step.log" 2>&1 &
for tool in memcheck racecheck; do
  { echo "== compute-sanitizer --tool $tool"
    timeout 170 compute-sanitizer --tool $tool --error-exitcode 99 ./test_prefill_cuda \
      --gtest_filter=PrefillCuda.SmallMixedForSanitizers 2>&1 | grep -vE "^\[ +(RUN|OK) " | tail -8
    echo "$tool rc=${PIPESTATUS[0]}"; } > "$logs/san.$tool.log" 2>&1 &
done
wait $(jobs -p | grep -v "^$warm$") 2>/dev/null
for f in plan step default.0 default.1 default.2 default.3 full.0 full.1 full.2 full.3 full.4 full.5 full.6 full.7 san.memcheck san.racecheck; do
  cat "$logs/$f.log"; done > "$OUT/ws3-tests.log"
grep -E "rc=|FAILED|ERROR SUMMARY|RACECHECK SUMMARY|ms total\)$" "$OUT/ws3-tests.log" | grep -v "from PrefillCuda " | head -40; date -u
if grep -qE "rc=[1-9]" "$OUT/ws3-tests.log"; then
  grep -B3 -A12 -m4 "Failure" "$OUT/ws3-tests.log" | head -60; echo "tests failed: timings anyway, not shippable"
fi
timeout 100 ./bench_prefill --benchmark_filter="${BENCH_FILTER:-gemm_ceiling|variant:[05]/}" \
  --benchmark_out="$OUT/bench_prefill.json" --benchmark_out_format=json --benchmark_counters_tabular=true \
  > "$OUT/bench_prefill.log" 2>&1
echo "bench_prefill rc=$?"; date -u
cd "$root"
( cd "$scripts" && LD_LIBRARY_PATH= timeout 50 python3 prefill_peer.py "$OUT/prefill-peer.json" > /tmp/peer.log 2>&1; echo "prefill_peer rc=$?"; tail -2 /tmp/peer.log
  python3 prefill_report.py "$OUT/bench_prefill.json" "$OUT/prefill-peer.json" > "$OUT/prefill-report.md" ); date -u
wait $warm; tail -n 1 /tmp/warm_fa2.log /tmp/warm_fa3.log
( cd "$scripts" && LD_LIBRARY_PATH= PYTHONPATH=/tmp/fi/site timeout 45 python3 flashinfer_prefill_peer.py "$OUT/flashinfer-prefill.json" \
    > /tmp/fi.log 2>&1; echo "flashinfer rc=$?"; tail -3 /tmp/fi.log ); date -u
python3 - "$OUT/bench_prefill.json" <<'PY'
import json, sys, re
rows = {}
for b in json.load(open(sys.argv[1]))["benchmarks"]:
    if not b["name"].startswith("prefill/"): 
        if "gemm" in b["name"]: print("gemm", round(b.get("TFLOPs", 0), 1))
        continue
    a = dict(re.findall(r"(\w+):(\d+)", b["name"]))
    rows.setdefault((a["shape"], a["batch"], a["hkv"], a["bs"], a["identity"]), {})[a["variant"]] = (b.get("TFLOPs", 0), b.get("max_diff_vs_shipped", 0))
print("shape batch hkv bs id | v0 | v5 | v5/v0 | maxdiff")
for k, v in sorted(rows.items()):
    if "0" in v and "5" in v:
        print(*k, "|", round(v["0"][0], 1), "|", round(v["5"][0], 1), "|", round(v["5"][0] / v["0"][0], 3), "|", v["5"][1])
PY
cat "$OUT/prefill-report.md" | head -40
