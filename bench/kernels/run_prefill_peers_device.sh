#!/usr/bin/env bash
# The prefill's whole device call (runs g and h of docs/benchmarks.md), from the repository root of
# the device copy: FlashInfer's JIT warm-up (fa2, fa3) beside the prefill tests and sanitizers
# (run_prefill_device.sh test; a failure stops the timings), then bench_prefill alone on the GPU,
# the SDPA peer and report, FlashInfer's timings, and Nsight Compute on one launch of the shipped
# wgmma body on the 16k prompt (tensor pipe, stall reasons). Carry PAGEDKV_PREFILL_BIN (default
# build/dev-gpu/bin: test_prefill_plan, test_prefill_cuda, test_attention_step_cuda,
# bench_prefill and libbenchmark; run_prefill_device.sh build makes them) and build/fi-peer
# (site.tar.xz: run_flashinfer_prefill_device.sh says how it is made). 8 files to $OUT:
# prefill-gpu.txt, prefill-tests.log, bench_prefill.json, prefill-peer.json, prefill-report.md,
# warm_fa3.log, flashinfer-prefill.json, ncu.txt. About 160 s on an H100.
set -u; export OUT
root=$PWD; scripts=$root/bench/kernels
bin=$(cd "${PAGEDKV_PREFILL_BIN:-build/dev-gpu/bin}" && pwd) || exit 1
export LD_LIBRARY_PATH=$bin PYTHONUNBUFFERED=1 MAX_JOBS=16
date -u
mkdir -p /tmp/fi && tar xJf build/fi-peer/site.tar.xz -C /tmp/fi
( cd "$scripts" && for b in fa2 fa3; do
    { PYTHONPATH=/tmp/fi/site timeout 170 python3 flashinfer_prefill_peer.py --warm --backends $b; echo "warm $b rc=$?"; } > /tmp/warm_$b.log 2>&1 &
  done; wait ) &
warm=$!
PAGEDKV_PREFILL_BIN=$bin timeout 150 bash "$scripts/run_prefill_device.sh" test > /tmp/tests.out 2>&1; echo "tests rc=$?" >> /tmp/tests.out
grep -vE '^\[ seed' /tmp/tests.out | tail -n 28; date -u
grep -q "tests rc=0" /tmp/tests.out || { echo "tests failed: no timings"; exit 1; }
cd "$bin" || exit 1
timeout 100 ./bench_prefill --benchmark_out="$OUT/bench_prefill.json" --benchmark_out_format=json \
  --benchmark_counters_tabular=true > /tmp/bench_prefill.log 2>&1; echo "bench_prefill rc=$?"; date -u
( cd "$scripts" && timeout 70 python3 prefill_peer.py "$OUT/prefill-peer.json" > /tmp/peer.log 2>&1; echo "prefill_peer rc=$?"
  python3 prefill_report.py "$OUT/bench_prefill.json" "$OUT/prefill-peer.json" > "$OUT/prefill-report.md" ); date -u
wait $warm; tail -n 1 /tmp/warm_fa2.log /tmp/warm_fa3.log; cp /tmp/warm_fa3.log "$OUT/"
( cd "$scripts" && PYTHONPATH=/tmp/fi/site timeout 45 python3 flashinfer_prefill_peer.py "$OUT/flashinfer-prefill.json" \
    > /tmp/fi.log 2>&1; echo "flashinfer rc=$?" ); date -u
cat "$OUT/prefill-report.md"
metrics=sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active
for r in barrier long_scoreboard wait short_scoreboard mio_throttle math_pipe_throttle gmma dispatch_stall not_selected selected; do
  metrics=$metrics,smsp__average_warps_issue_stalled_${r}_per_issue_active.ratio
done
timeout 25 /usr/local/cuda/bin/ncu --clock-control none --section SpeedOfLight --section SchedulerStats --metrics $metrics \
  -k regex:prefill_wgmma --launch-count 1 ./bench_prefill --benchmark_filter="prefill/shape:1/batch:1/hkv:32/bs:16/identity:0/variant:0/" \
  > "$OUT/ncu.txt" 2>&1
grep -E "Duration|tensor_cycles|stalled_(barrier|wait|gmma|long)" "$OUT/ncu.txt" | sed "s/smsp__average_warps_issue_stalled_//"; date -u
