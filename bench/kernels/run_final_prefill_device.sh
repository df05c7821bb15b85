#!/usr/bin/env bash
# The prefill against every peer, with the engine's one-GPU checks, in one call (run f2 of
# docs/benchmarks.md): from the repository root, carrying build/<name> (this script,
# run_final_tests_device.sh as final3.sh, blas.tar.xz, engine.tar.xz: pagedkv-llama,
# test_cuda_backend, test_llama_engine; pf.tar.xz: pf/ with test_prefill_plan, test_prefill_cuda,
# test_attention_step_cuda, bench_prefill, libbenchmark.so.1debian) and build/fi-peer. Run f2 ran it
# as build/dev-final3/final4.sh; d below names that folder.
set -u; export OUT
root=$PWD; d=$root/build/dev-final3
(cd "$d" && tar xJf engine.tar.xz && tar xJf pf.tar.xz) || exit 1
mkdir -p /tmp/fi "$OUT/engine" "$OUT/prefill" && tar xJf build/fi-peer/site.tar.xz -C /tmp/fi
( cd bench/kernels && for b in fa2 fa3; do
    { PYTHONPATH=/tmp/fi/site MAX_JOBS=16 timeout 330 python3 flashinfer_prefill_peer.py --warm --backends $b; echo "warm $b rc=$?"; } > /tmp/warm_$b.log 2>&1 &
  done; wait ) &
warm=$!
OUT=$OUT/engine bash "$d/final3.sh"; date -u
OUT=$OUT/prefill BENCH_TIMEOUT=110 BENCH_FILTER='gemm_ceiling|variant:0/' bash bench/kernels/run_prefill_ws_device.sh "$d/pf"; date -u
( cd bench/kernels && LD_LIBRARY_PATH= timeout 70 python3 prefill_peer.py "$OUT/prefill/prefill-peer.json" > /tmp/peer.log 2>&1; echo "prefill_peer rc=$?"; tail -2 /tmp/peer.log
  python3 prefill_report.py "$OUT/prefill/bench_prefill.json" "$OUT/prefill/prefill-peer.json" > "$OUT/prefill/prefill-report.md" ); date -u
wait $warm; tail -n 1 /tmp/warm_fa2.log /tmp/warm_fa3.log; cp /tmp/warm_fa3.log "$OUT/prefill/"; date -u
( cd bench/kernels && PYTHONPATH=/tmp/fi/site timeout 60 python3 flashinfer_prefill_peer.py "$OUT/prefill/flashinfer-prefill.json" \
    > /tmp/fi.log 2>&1; echo "flashinfer rc=$?"; tail -3 /tmp/fi.log ); date -u
cat "$OUT/prefill/prefill-report.md" | head -60
