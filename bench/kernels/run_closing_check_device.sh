#!/usr/bin/env bash
# A session's closing check of the prefill (issue 21) and the one-GPU engine, in two calls on one
# warm H100 (kind nvidia-h100-x1; the second within the 30 s the machine stays warm, so that
# FlashInfer's JIT cache of the first is still there). From the repository root, carrying
# build/<dir> (this folder: engine.tar.xz with pagedkv-llama, test_cuda_backend and
# test_llama_engine; pf.tar.xz with pf/ holding test_prefill_plan, test_prefill_cuda,
# test_attention_step_cuda, bench_prefill and libbenchmark.so.1debian of the default build, and
# sweep/test_prefill_cuda of the PAGEDKV_KERNELS_FULL_SWEEP build; blas.tar.xz) and build/fi-peer.
#   run_closing_check_device.sh <dir> tests   FlashInfer's JIT warm-up beside: the engine's one-GPU
#                                             tests and memcheck; the prefill tests of both builds
#                                             (8 shards each), memcheck and racecheck
#   run_closing_check_device.sh <dir> bench   bench_prefill's shipped rows, SDPA (flash, cuDNN),
#                                             FlashInfer fa2 and fa3 on the same shapes, then 16 x 1k
#                                             against fa3 each alone in turns (ROUNDS, default 3)
# Writes under $OUT (at most 8 files come back: the logs are tarred).
set -u; export OUT
root=$PWD; d=$(cd "${1:?the carried folder}" && pwd) || exit 1; mode=${2:?tests or bench}
logs=/tmp/closing; mkdir -p "$logs" /tmp/fi
[[ -d $d/pf ]] || (cd "$d" && tar xJf pf.tar.xz && tar xJf engine.tar.xz && mkdir -p lib && tar xJf blas.tar.xz -C lib) || exit 1
[[ -d /tmp/fi/site ]] || tar xJf "$root/build/fi-peer/site.tar.xz" -C /tmp/fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader; date -u
if [[ $mode == tests ]]; then
  ( cd "$root/bench/kernels" && for b in fa2 fa3; do
      { PYTHONPATH=/tmp/fi/site MAX_JOBS=16 timeout 330 python3 flashinfer_prefill_peer.py --warm --backends $b; echo "warm $b rc=$?"; } > "$logs/warm_$b.log" 2>&1 &
    done; wait ) &
  warm=$!
  ( cd "$d" && export LD_LIBRARY_PATH=$d/lib:$d PAGEDKV_GOLDEN_DIR=$root/tests/runner/golden
    { timeout 150 ./test_cuda_backend; echo "test_cuda_backend rc=$?"
      timeout 90 ./test_llama_engine --gtest_filter='*cuda*'; echo "test_llama_engine (cuda) rc=$?"
      timeout 200 compute-sanitizer --tool memcheck --error-exitcode 99 ./test_cuda_backend \
        --gtest_filter='*CopyOnWriteAtTheInputBound*:*DecodeGraphs*:*OneToken*:*ReservedSteps*'; echo "memcheck test_cuda_backend rc=$?"
    } > "$logs/engine-tests.log" 2>&1 )
  grep -E "PASSED|FAILED|ERROR SUMMARY|rc=" "$logs/engine-tests.log"; date -u
  OUT=$logs/default BENCH_FILTER='^$' bash "$root/bench/kernels/run_prefill_ws_device.sh" "$d/pf" > "$logs/default.log" 2>&1
  grep -E "rc=|FAILED|SUMMARY" "$logs/default.log" | sed 's/^/default: /' | head -20
  cp "$d"/pf/test_prefill_plan "$d"/pf/test_attention_step_cuda "$d/sweep/" 2>/dev/null
  OUT=$logs/sweep BENCH_FILTER='^$' bash "$root/bench/kernels/run_prefill_ws_device.sh" "$d/sweep" > "$logs/sweep.log" 2>&1
  grep -E "rc=|FAILED|SUMMARY" "$logs/sweep.log" | sed 's/^/full sweep: /' | head -20
  grep -h "Failure" -A8 "$logs"/default/ws-tests.log "$logs"/sweep/ws-tests.log 2>/dev/null | head -40
  wait $warm; tail -qn 1 "$logs"/warm_fa2.log "$logs"/warm_fa3.log
else
  OUT=$logs SKIP_TESTS=1 BENCH_TIMEOUT=110 BENCH_FILTER='gemm_ceiling|variant:0/' bash "$root/bench/kernels/run_prefill_ws_device.sh" "$d/pf" \
    > "$logs/bench.log" 2>&1; tail -1 "$logs/bench.log"
  ( cd "$root/bench/kernels" && LD_LIBRARY_PATH= timeout 70 python3 prefill_peer.py "$logs/prefill-peer.json" > "$logs/peer.log" 2>&1
    echo "prefill_peer rc=$?"
    PYTHONPATH=/tmp/fi/site timeout 90 python3 flashinfer_prefill_peer.py "$logs/flashinfer-prefill.json" > "$logs/fi.log" 2>&1
    echo "flashinfer rc=$?"
    { python3 prefill_report.py "$logs/bench_prefill.json" "$logs/prefill-peer.json"
      python3 prefill_variant_summary.py 0 "$logs/bench_prefill.json" "$logs/prefill-peer.json" "$logs/flashinfer-prefill.json" \
        | sed -n '/^| shape | batch | heads | shipped (mean)/,$p'; } > "$logs/prefill-report.md" 2>&1 )
  mkdir -p "$d/dv" && cp "$d/pf/bench_prefill" "$d/pf/libbenchmark.so.1debian" "$d/dv/" && tar cJf "$d/dv.tar.xz" -C "$d" dv
  OUT=$logs FA3_SHAPE=prompts_16x1k bash "$root/bench/kernels/run_prefill_fa3_pairs_device.sh" "$d" "${ROUNDS:-3}" > "$logs/pairs.log" 2>&1
  tail -12 "$logs/pairs.log"
  cp "$logs/prefill-report.md" "$OUT/" 2>/dev/null; head -70 "$logs/prefill-report.md"
fi
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu --format=csv,noheader; date -u
tar cJf "$OUT/closing-$mode.tar.xz" -C "$logs" .
