#!/usr/bin/env bash
# The decode kernel at the engine's shapes (issue 20, docs/journal/decode-kernel.md "Short contexts
# at large batch"), in one call: bench_decode's read ceiling and decode_engine rows first (the
# library's plan against forced CTA shapes, read-ahead on and off, uniform and engine-spread
# lengths, and the decode table's large shapes with and without read-ahead), then
# test_decode_cuda (default build, 16 gtest shards) and compute-sanitizer memcheck on a subset
# beside it. Run from a folder holding bench_decode, test_decode_cuda, libbenchmark.so.1debian
# and this script; writes under $OUT: bench_decode.json, bench.log, tests.log.
set -u
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=$PWD
out=${OUT:-/tmp/pagedkv-out}
logs=/tmp/pagedkv-logs
mkdir -p "$out" "$logs"
gpu=$(nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv; date -u)
echo "$gpu"
timeout 110 ./bench_decode --benchmark_filter='read_ceiling|decode_engine' --benchmark_out="$out/bench_decode.json" \
  --benchmark_out_format=json --benchmark_counters_tabular=true > "$out/bench.log" 2>&1
echo "bench_decode rc=$?"
shards=14
for i in $(seq 0 $((shards - 1))); do
  { GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$i timeout 110 ./test_decode_cuda
    echo "test_decode_cuda shard $i rc=$?"; } > "$logs/decode.$i.log" 2>&1 &
done
san="--gtest_filter=DecodeCuda.SmallMixedForSanitizers:DecodeCuda.LooseMaxKvLen:DecodeCuda.GraphReplayFollowsLengthsOnTheDevice:DecodeCuda.BatchOneTo256Ragged"
{ echo "== compute-sanitizer --tool memcheck ./test_decode_cuda $san"
  timeout 110 compute-sanitizer --tool memcheck --error-exitcode 99 ./test_decode_cuda "$san" 2>&1 | grep -vE "^\[ +(RUN|OK) " | tail -8
  echo "rc=${PIPESTATUS[0]}"; } > "$logs/memcheck.log" 2>&1 &
wait
{ echo "$gpu"; for i in $(seq 0 $((shards - 1))); do cat "$logs/decode.$i.log"; done; cat "$logs/memcheck.log"; } > "$out/tests.log"
grep -E "rc=|PASSED|FAILED|Failure" "$out/tests.log" | head -40
grep -E "^== |ERROR SUMMARY" "$out/tests.log"
# The short table last: name, us, % of the read ceiling, splits, CTA shape, read-ahead.
python3 - "$out/bench_decode.json" <<'PY'
import json, sys
for b in json.load(open(sys.argv[1]))["benchmarks"]:
    n = b["name"].replace("decode_engine/", "").replace("/bs:16/hd:128/hq:32", "").replace("/fp8:0", "").replace("/hnd:0/max_splits:0", "").replace("/manual_time", "")
    print(f'{n:75s} {b.get("us", b.get("real_time", 0)):8.1f} {b.get("pct_ceiling", 0):6.1f} {int(b.get("splits", 0)):3d} {int(b.get("cta", -1)):2d} {int(b.get("ahead", 0)):4d} {b.get("mean_ctx", 0):6.0f} {int(b.get("longest", 0)):5d}')
PY
