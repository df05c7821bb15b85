#!/usr/bin/env bash
# Helper diag's device call (session 6, docs/journal/prefill-kernel.md, runs dg): the wgmma body
# whose warpgroups compute their last KV tile over its first 64 keys where their rows attend no
# further (bench_prefill's variant 5) against the shipped body. From the repository root, carrying
# build/<dir> (this script, run_prefill_ws_device.sh, prefill_variant_summary.py and dg.tar.xz: dg/
# with test_prefill_plan, test_prefill_cuda, test_attention_step_cuda, bench_prefill and
# libbenchmark.so.1debian) and build/fi-peer. FlashInfer's JIT warm-up starts first, beside the
# prefill tests (every bf16 wgmma case also on variant 5) with memcheck and racecheck; then
# bench_prefill's shipped body (0) and variant 5 on every issue-21 row, twice each in random
# interleaved order; then SDPA and FlashInfer fa2/fa3 on the same shapes. Logs to $OUT.
# Usage: bash <dir>/run_prefill_diag_device.sh <dir>
set -u; export OUT
root=$PWD; d=$(cd "${1:?the carried folder}" && pwd) || exit 1
(cd "$d" && tar xJf dg.tar.xz) || exit 1
bin=$d/dg; cp "$d"/run_prefill_ws_device.sh "$d"/prefill_variant_summary.py "$bin"/
mkdir -p /tmp/fi && tar xJf "$root/build/fi-peer/site.tar.xz" -C /tmp/fi
( cd "$root/bench/kernels" && for b in fa2 fa3; do
    { PYTHONPATH=/tmp/fi/site MAX_JOBS=16 timeout 300 python3 flashinfer_prefill_peer.py --warm --backends $b; echo "warm $b rc=$?"; } > /tmp/warm_$b.log 2>&1 &
  done; wait ) &
warm=$!
BENCH_FILTER='gemm_ceiling' BENCH_TIMEOUT=30 bash "$bin/run_prefill_ws_device.sh" "$bin" || { wait $warm; exit 1; }
echo "tests done after ${SECONDS}s"
( cd "$bin" && LD_LIBRARY_PATH=$bin timeout "${BENCH_TIMEOUT:-170}" ./bench_prefill \
    --benchmark_filter='gemm_ceiling|prefill/.*variant:[05]/' --benchmark_repetitions=2 \
    --benchmark_enable_random_interleaving=true --benchmark_out="$OUT/bench_prefill.json" --benchmark_out_format=json \
    --benchmark_counters_tabular=true > "$OUT/bench_prefill.log" 2>&1; echo "bench_prefill rc=$? after ${SECONDS}s" )
( cd "$root/bench/kernels" && LD_LIBRARY_PATH= timeout 70 python3 prefill_peer.py "$OUT/prefill-peer.json" > /tmp/peer.log 2>&1
  echo "prefill_peer rc=$? after ${SECONDS}s"; tail -2 /tmp/peer.log )
wait $warm; tail -n 1 /tmp/warm_fa2.log /tmp/warm_fa3.log; echo "warm-up done after ${SECONDS}s"
( cd "$root/bench/kernels" && PYTHONPATH=/tmp/fi/site timeout 60 python3 flashinfer_prefill_peer.py "$OUT/flashinfer-prefill.json" \
    > /tmp/fi.log 2>&1; echo "flashinfer rc=$? after ${SECONDS}s"; tail -3 /tmp/fi.log )
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv; date -u
python3 "$bin/prefill_variant_summary.py" 5 "$OUT/bench_prefill.json" "$OUT/prefill-peer.json" "$OUT/flashinfer-prefill.json" \
  | tee "$OUT/summary.md"
