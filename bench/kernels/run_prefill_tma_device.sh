#!/usr/bin/env bash
# One device call for the wgmma prefill's TMA copy path (docs/journal/prefill-kernel.md, "K/V
# tiles by the bulk tensor copy"): the prefill tests (test_prefill_cuda in 8 gtest shards,
# test_prefill_plan, test_attention_step_cuda) with compute-sanitizer memcheck and racecheck on
# the small case beside them; once the tests and memcheck pass bench_prefill's shipped rows (variant 0) and the other
# copy path (variant 4) with the GEMM ceiling. Run from a folder holding those four binaries and
# libbenchmark (bash bench/kernels/run_prefill_device.sh build makes them); logs to $OUT:
# tma-tests.log, bench_prefill.json, bench_prefill.log. About 150 s on an H100.
set -u
bin=$(cd "${1:-.}" && pwd) || exit 1
out=${OUT:-/tmp/pagedkv-tma-out}; logs=/tmp/pagedkv-tma-logs
mkdir -p "$out" "$logs"; cd "$bin" || exit 1
export LD_LIBRARY_PATH=$bin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv; date -u
for i in $(seq 0 7); do
  { GTEST_TOTAL_SHARDS=8 GTEST_SHARD_INDEX=$i timeout 90 ./test_prefill_cuda; echo "test_prefill_cuda shard $i rc=$?"; } \
    > "$logs/prefill.$i.log" 2>&1 &
done
{ timeout 60 ./test_prefill_plan; echo "test_prefill_plan rc=$?"; } > "$logs/plan.log" 2>&1 &
{ timeout 90 ./test_attention_step_cuda; echo "test_attention_step_cuda rc=$?"; } > "$logs/step.log" 2>&1 &
for tool in memcheck racecheck; do
  { echo "== compute-sanitizer --tool $tool"
    timeout 90 compute-sanitizer --tool $tool --error-exitcode 99 ./test_prefill_cuda \
      --gtest_filter=PrefillCuda.SmallMixedForSanitizers 2>&1 | grep -vE "^\[ +(RUN|OK) " | tail -8
    echo "$tool rc=${PIPESTATUS[0]}"; } > "$logs/san.$tool.log" 2>&1 &
done
wait
cat "$logs"/plan.log "$logs"/step.log "$logs"/prefill.*.log "$logs"/san.*.log > "$out/tma-tests.log"
grep -E "rc=|FAILED|Failure|ERROR SUMMARY|RACECHECK SUMMARY" "$out/tma-tests.log" | head -40; date -u
# A failed test or memcheck stops the call (racecheck's verdict is reported, the timings still run).
if grep -v "^racecheck rc=" "$out/tma-tests.log" | grep -qE "rc=[1-9]"; then grep -B5 -A15 -m3 "Failure" "$out/tma-tests.log" | head -80; echo "tests failed: no bench"; exit 1; fi
timeout 100 ./bench_prefill --benchmark_filter='gemm_ceiling|variant:[04]/' --benchmark_out="$out/bench_prefill.json" \
  --benchmark_out_format=json --benchmark_counters_tabular=true > "$out/bench_prefill.log" 2>&1
echo "bench_prefill rc=$?"; grep -E "gemm|prefill" "$out/bench_prefill.log" | head -40; date -u
