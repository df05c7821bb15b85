#!/usr/bin/env bash
# One device call for the warp-specialised wgmma prefill (docs/journal/prefill-kernel.md, session
# 4): the prefill tests (test_prefill_cuda in 8 gtest shards, every wgmma case through every body;
# test_prefill_plan; test_attention_step_cuda) with compute-sanitizer memcheck and racecheck on
# the small case beside them; once the tests and memcheck pass, bench_prefill's rows matching
# BENCH_FILTER (default: the GEMM ceiling, the shipped body and its variants 4 and up) in one run.
# Run from a folder holding those four binaries and libbenchmark (bash
# bench/kernels/run_prefill_device.sh build makes them); logs to $OUT: ws-tests.log,
# bench_prefill.json, bench_prefill.log.
set -u
bin=$(cd "${1:-.}" && pwd) || exit 1
out=${OUT:-/tmp/pagedkv-ws-out}; logs=/tmp/pagedkv-ws-logs
filter=${BENCH_FILTER:-'gemm_ceiling|bs:(16|64|256)/identity:0/variant:[04-9]/'}
mkdir -p "$out" "$logs"; cd "$bin" || exit 1
export LD_LIBRARY_PATH=$bin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv; date -u
if [[ ${SKIP_TESTS:-0} != 1 ]]; then
  for i in $(seq 0 7); do
    { GTEST_TOTAL_SHARDS=8 GTEST_SHARD_INDEX=$i timeout 110 ./test_prefill_cuda; echo "test_prefill_cuda shard $i rc=$?"; } \
      > "$logs/prefill.$i.log" 2>&1 &
  done
  { timeout 60 ./test_prefill_plan; echo "test_prefill_plan rc=$?"; } > "$logs/plan.log" 2>&1 &
  { timeout 110 ./test_attention_step_cuda; echo "test_attention_step_cuda rc=$?"; } > "$logs/step.log" 2>&1 &
  for tool in memcheck racecheck; do
    { echo "== compute-sanitizer --tool $tool"
      timeout 110 compute-sanitizer --tool $tool --error-exitcode 99 ./test_prefill_cuda \
        --gtest_filter=PrefillCuda.SmallMixedForSanitizers 2>&1 | grep -vE "^\[ +(RUN|OK) " | tail -8
      echo "$tool rc=${PIPESTATUS[0]}"; } > "$logs/san.$tool.log" 2>&1 &
  done
  wait
  cat "$logs"/plan.log "$logs"/step.log "$logs"/prefill.*.log "$logs"/san.*.log > "$out/ws-tests.log"
  grep -E "rc=|FAILED|ERROR SUMMARY|RACECHECK SUMMARY" "$out/ws-tests.log" | head -40; date -u
  # A failed test or memcheck stops the call (racecheck's verdict is reported, the timings still run).
  if grep -v "^racecheck rc=" "$out/ws-tests.log" | grep -qE "rc=[1-9]"; then
    grep -B3 -A12 -m4 "Failure" "$out/ws-tests.log" | head -90; echo "tests failed: no bench"; exit 1
  fi
fi
timeout "${BENCH_TIMEOUT:-110}" ./bench_prefill --benchmark_filter="$filter" --benchmark_out="$out/bench_prefill.json" \
  --benchmark_out_format=json --benchmark_counters_tabular=true > "$out/bench_prefill.log" 2>&1
echo "bench_prefill rc=$?"
grep -E "Benchmark|gemm|prefill" "$out/bench_prefill.log" | sed -E 's/ +/ /g; s/\/manual_time//; s/prefill\/shape/s/' | head -60; date -u
