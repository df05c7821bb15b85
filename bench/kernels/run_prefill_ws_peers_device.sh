#!/usr/bin/env bash
# One device call for the wgmma prefill against its peers, from the repository root: FlashInfer's
# JIT warm-up beside the tests and sanitizers (run_prefill_ws_device.sh), bench_prefill's rows matching BENCH_FILTER (default: the
# shipped body, variant 0, and variant 7, the other CTA order), the SDPA peer, the report,
# FlashInfer's timings (after a warm-up of at most 150 s). Carry PAGEDKV_PREFILL_BIN (default
# build/dev-ws2: the four test and bench binaries and libbenchmark) and
# build/fi-peer. To $OUT: ws-tests.log, bench_prefill.json, bench_prefill.log, prefill-peer.json,
# prefill-report.md, flashinfer-prefill.json. Run ws2-b: about 200 s on an H100.
set -u; export OUT
root=$PWD; scripts=$root/bench/kernels; bin=$(cd "${PAGEDKV_PREFILL_BIN:-build/dev-ws2}" && pwd) || exit 1
export PYTHONUNBUFFERED=1 MAX_JOBS=16
mkdir -p /tmp/fi && tar xJf build/fi-peer/site.tar.xz -C /tmp/fi
( cd "$scripts" && for b in fa2 fa3; do
    { PYTHONPATH=/tmp/fi/site timeout 150 python3 flashinfer_prefill_peer.py --warm --backends $b; echo "warm $b rc=$?"; } > /tmp/warm_$b.log 2>&1 &
  done; wait ) &
warm=$!
BENCH_TIMEOUT=80 BENCH_FILTER=${BENCH_FILTER:-'gemm_ceiling|bs:16/identity:0/variant:[07]/'} bash "$scripts/run_prefill_ws_device.sh" "$bin" || exit 1
( cd "$scripts" && LD_LIBRARY_PATH= timeout 60 python3 prefill_peer.py "$OUT/prefill-peer.json" > /tmp/peer.log 2>&1; echo "prefill_peer rc=$?"; tail -3 /tmp/peer.log
  python3 prefill_report.py "$OUT/bench_prefill.json" "$OUT/prefill-peer.json" > "$OUT/prefill-report.md" ); date -u
wait $warm; tail -n 1 /tmp/warm_fa2.log /tmp/warm_fa3.log
( cd "$scripts" && PYTHONPATH=/tmp/fi/site timeout 45 python3 flashinfer_prefill_peer.py "$OUT/flashinfer-prefill.json" \
    > /tmp/fi.log 2>&1; echo "flashinfer rc=$?"; tail -3 /tmp/fi.log ); date -u
cat "$OUT/prefill-report.md"
