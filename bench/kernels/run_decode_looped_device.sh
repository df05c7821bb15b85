#!/usr/bin/env bash
# Looped decode CTAs (issue 20, docs/journal/decode-kernel.md "Looped CTAs") against main, in one
# call (run gqa2; the looped CTAs and bench_decode's plan:8 rows are 8a1ab99's, reverted after
# it): bench_decode of main (old/) and of this build on the read ceiling, the decode table's bf16
# and fp8 rows and the engine rows (the library's plan, forced narrow, forced looped); ncu on the
# uniform 200 x 250 GQA row, looped and narrow; llama3-8b in the engine (old/pagedkv-llama, then
# this build's); then test_decode_cuda (14 shards), test_cuda_backend, test_llama_engine's CUDA
# cases and compute-sanitizer memcheck on subsets of both. Run from a folder holding bin.tar.xz
# (bench_decode, test_decode_cuda, pagedkv-llama, test_cuda_backend, test_llama_engine,
# libbenchmark.so.1debian, old/bench_decode, old/pagedkv-llama), blas.tar.xz and this script;
# writes under $OUT: old.json, new.json, engine.log, ncu.txt, tests.log.
set -u
cd "$(dirname "$0")"
mkdir -p lib && tar xJf bin.tar.xz && tar xJf blas.tar.xz -C lib
export LD_LIBRARY_PATH=$PWD/lib:$PWD
export PAGEDKV_GOLDEN_DIR=${PAGEDKV_GOLDEN_DIR:-$(cd ../../tests/runner/golden && pwd)}
out=${OUT:-/tmp/pagedkv-out}
logs=/tmp/pagedkv-logs
mkdir -p "$out" "$logs"
gpu=$(nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv; date -u)
echo "$gpu"
filter='read_ceiling|decode_shape/|decode_fp8/|decode_engine/.*plan:(0|1|8)/'
for b in old new; do
  bin=./bench_decode; [ $b = old ] && bin=old/bench_decode
  timeout 70 $bin --benchmark_filter="$filter" --benchmark_out="$out/$b.json" --benchmark_out_format=json \
    --benchmark_counters_tabular=true > "$logs/bench_$b.log" 2>&1
  echo "bench_decode $b rc=$? $(date -u +%T)"
done
m=gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__cycles_active.min,sm__cycles_active.avg
m=$m,sm__cycles_active.max,sm__cycles_elapsed.max
for plan in 8 1; do
  row="decode_engine/batch:200/ctx:250/bs:16/hd:128/hq:32/hkv:8/fp8:0/table:2/hnd:0/max_splits:0/lengths:0/plan:$plan/"
  echo "== ncu $row" >> "$out/ncu.txt"
  timeout 40 ncu --clock-control none --cache-control none --metrics "$m" -k regex:decode_mma_kernel --launch-skip 4 \
    --launch-count 1 ./bench_decode --benchmark_filter="$row" >> "$out/ncu.txt" 2>&1
  echo "rc=$?" >> "$out/ncu.txt"
done
grep -E "^== |rc=|gpu__time|dram__|sm__" "$out/ncu.txt" | sed -E 's/ +/ /g'
common=(--device cuda --bench --bench-requests 256 --bench-length-scale 1 --bench-max-prompt 1024
        --max-tokens 1024 --max-batch-tokens 2048 --max-num-seqs 256 --seed 1 --model-shape llama3-8b)
for b in old new; do
  bin=./pagedkv-llama; [ $b = old ] && bin=old/pagedkv-llama
  echo "== 8b_$b: $bin ${common[*]}" >> "$out/engine.log"
  timeout 80 $bin "${common[@]}" >> "$out/engine.log" 2> "$logs/8b_$b.err"; echo "rc=$?" >> "$out/engine.log"
  tail -2 "$logs/8b_$b.err" >> "$out/engine.log"
done
grep -E "^==|output tokens/s|decode step|decode batch|prefill|rc=" "$out/engine.log"
shards=14
for i in $(seq 0 $((shards - 1))); do
  { GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$i timeout 150 ./test_decode_cuda
    echo "test_decode_cuda shard $i rc=$?"; } > "$logs/decode.$i.log" 2>&1 &
done
san="--gtest_filter=DecodeCuda.LoopedCtas:DecodeCuda.SmallMixedForSanitizers:DecodeCuda.GraphReplayFollowsLengthsOnTheDevice"
{ echo "== compute-sanitizer --tool memcheck ./test_decode_cuda $san"
  timeout 150 compute-sanitizer --tool memcheck --error-exitcode 99 ./test_decode_cuda "$san" 2>&1 | grep -vE "^\[ +(RUN|OK) " | tail -8
  echo "rc=${PIPESTATUS[0]}"; } > "$logs/memcheck.log" 2>&1 &
{ timeout 150 ./test_cuda_backend; echo "test_cuda_backend rc=$?"; } > "$logs/backend.log" 2>&1 &
{ timeout 150 ./test_llama_engine --gtest_filter='*cuda*'; echo "test_llama_engine (cuda) rc=$?"; } > "$logs/engine_tests.log" 2>&1 &
{ echo "== compute-sanitizer --tool memcheck ./test_cuda_backend *DecodeGraphs*:*OneToken*"
  timeout 150 compute-sanitizer --tool memcheck --error-exitcode 99 ./test_cuda_backend \
    --gtest_filter='*DecodeGraphs*:*OneToken*' 2>&1 | grep -vE "^\[ +(RUN|OK) " | tail -8
  echo "rc=${PIPESTATUS[0]}"; } > "$logs/memcheck_backend.log" 2>&1 &
wait
{ echo "$gpu"; for i in $(seq 0 $((shards - 1))); do cat "$logs/decode.$i.log"; done
  cat "$logs/memcheck.log" "$logs/backend.log" "$logs/engine_tests.log" "$logs/memcheck_backend.log"; } > "$out/tests.log"
echo "tests done $(date -u +%T)"
grep -E "rc=|PASSED|FAILED|Failure" "$out/tests.log" | head -60
grep -E "^== |ERROR SUMMARY" "$out/tests.log"
# The short table last: name, old us, new us, new/old, old and new % of the read ceiling, old and new CTA shape.
python3 - "$out/old.json" "$out/new.json" <<'PY'
import json, sys
def rows(f):
    return {b["name"]: b for b in json.load(open(f))["benchmarks"]}
old, new = rows(sys.argv[1]), rows(sys.argv[2])
for name, b in new.items():
    n = name.replace("/bs:16/hd:128/hq:32", "").replace("/max_splits:0", "").replace("/min_time:0.100/manual_time", "")
    o = old.get(name)
    us = b.get("us", b.get("real_time", 0))
    if o:
        ous = o.get("us", o.get("real_time", 0))
        print(f'{n:66s} {ous:8.1f} {us:8.1f} {us / ous if ous else 0:6.3f} {o.get("pct_ceiling", 0):5.1f} {b.get("pct_ceiling", 0):5.1f} {int(o.get("cta", -1)):2d} {int(b.get("cta", -1)):2d}')
    else:
        print(f'{n:66s} {"":8s} {us:8.1f} {"":6s} {"":5s} {b.get("pct_ceiling", 0):5.1f} {"":2s} {int(b.get("cta", -1)):2d}')
PY
