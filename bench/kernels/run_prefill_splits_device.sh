#!/usr/bin/env bash
# One device call for the prefill's split rule and its start (docs/journal/prefill-kernel.md,
# session 5, helper ws3b), from the repository root: FlashInfer's fa2/fa3 JIT warm-up in the
# background first; the prefill tests, memcheck and racecheck (run_prefill_ws_device.sh); bench_prefill's
# shipped rows against variants 5 and 8 (the split rule before), 6 (the first tile's block ids read
# ahead) and the mma.sync body's batch-1 chunk; Nsight Compute on 16 x 1k (32/32, warp states and
# scheduler) and on the batch-1 chunk (32/32) with one split and with three; the SDPA peer, the
# report, FlashInfer's timings if its warm-up ended. Carry PAGEDKV_PREFILL_BIN (the four test and
# bench binaries, libbenchmark and this script's folder) and build/fi-peer. To $OUT: ws-tests.log,
# bench_prefill.json, bench_prefill.log, ncu.txt, prefill-peer.json, prefill-report.md,
# flashinfer-prefill.json. Ends by about 270 s.
set -u; export OUT
root=$PWD; scripts=$root/bench/kernels; bin=$(cd "${PAGEDKV_PREFILL_BIN:-build/dev-ws3/bin}" && pwd) || exit 1
export PYTHONUNBUFFERED=1 MAX_JOBS=16
mkdir -p /tmp/fi && tar xJf build/fi-peer/site.tar.xz -C /tmp/fi
( cd "$scripts" && for b in fa2 fa3; do
    { PYTHONPATH=/tmp/fi/site timeout 215 python3 flashinfer_prefill_peer.py --warm --backends $b; echo "warm $b rc=$?"; } > /tmp/warm_$b.log 2>&1 &
  done; wait ) &
warm=$!
BENCH_TIMEOUT=90 BENCH_FILTER=${BENCH_FILTER:-'gemm_ceiling|variant:0/|variant:[56]/|shape:3/batch:1/.*variant:[18]/'} \
  bash "$bin/run_prefill_ws_device.sh" "$bin" || exit 1
echo "after bench: ${SECONDS}s"
( cd "$bin" && export LD_LIBRARY_PATH=$bin
  prof() { timeout 40 ncu --clock-control none "$@" 2>&1 | grep -vE "^==PROF==|^\[" ; }
  echo "=== 16 x 1k, 32/32, shipped body"
  prof -k regex:prefill_wgmma_ws -c 1 --section SpeedOfLight --section LaunchStats --section Occupancy \
    --section WarpStateStats --section SchedulerStats \
    --metrics gpu__time_duration.sum,sm__cycles_active.min,sm__cycles_active.max,sm__cycles_active.avg,sm__cycles_elapsed.max \
    ./bench_prefill --benchmark_filter='prefill/shape:2/batch:16/hkv:32/bs:16/identity:0/variant:0/' --benchmark_min_time=0.01
  for v in 0 5; do
    echo "=== 512 over 8k, batch 1, 32/32, variant $v (kernel and merge)"
    prof -k 'regex:prefill_wgmma_ws|merge' -c 2 --section SpeedOfLight --section LaunchStats \
      --metrics gpu__time_duration.sum,sm__cycles_active.min,sm__cycles_active.max,sm__cycles_active.avg,sm__cycles_elapsed.max \
      ./bench_prefill --benchmark_filter="prefill/shape:3/batch:1/hkv:32/bs:16/identity:0/variant:$v/" --benchmark_min_time=0.01
  done ) > "$OUT/ncu.txt" 2>&1
grep -E "^  [a-z_]*prefill|^  void|Duration|sm__cycles_active|Grid Size|One or More|No Eligible|Issued Warp|Stall|Warp Cycles" "$OUT/ncu.txt" | head -60
echo "after ncu: ${SECONDS}s"
( cd "$scripts" && LD_LIBRARY_PATH= timeout 50 python3 prefill_peer.py "$OUT/prefill-peer.json" > /tmp/peer.log 2>&1; echo "prefill_peer rc=$?"; tail -2 /tmp/peer.log
  python3 prefill_report.py "$OUT/bench_prefill.json" "$OUT/prefill-peer.json" > "$OUT/prefill-report.md" )
echo "after SDPA: ${SECONDS}s"
wait $warm; tail -n 1 /tmp/warm_fa2.log /tmp/warm_fa3.log
left=$((268 - SECONDS)); echo "FlashInfer timings with ${left}s left"
if (( left > 15 )); then
  ( cd "$scripts" && PYTHONPATH=/tmp/fi/site timeout "$left" python3 flashinfer_prefill_peer.py "$OUT/flashinfer-prefill.json" \
      > /tmp/fi.log 2>&1; echo "flashinfer rc=$?"; tail -3 /tmp/fi.log )
fi
echo "end: ${SECONDS}s"; cat "$OUT/prefill-report.md"
