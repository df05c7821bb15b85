#!/usr/bin/env bash
# Everything the kernels need the GPU for, in one call: GPU tests, compute-sanitizer memcheck and
# racecheck, the benchmarks (bench_decode, bench_stream, bench_cache_ops), the SDPA, FlashInfer and
# merge_states peers and the report. Run from a folder holding the binaries (test_decode_cuda,
# test_cache_ops_cuda, test_merge_cuda, test_kv_pool_cuda, bench_decode, bench_stream,
# bench_cache_ops, libbenchmark.so.1debian) and these scripts (report.py, merge_report.py,
# sdpa_peer.py, flashinfer_peer.py, merge_peer.py and the cuda_graph_timing.py they import); writes
# under $OUT at most the 8 files the device tool brings back: tests.log, bench_decode.json,
# stream.csv, cache_ops.json, sdpa.json, flashinfer.json, decode.png and report.md (the GPU's name
# and clocks head tests.log and report.md; the merge_states peers' times come back in report.md's
# table).
set -u
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=$PWD
export PYTHONUNBUFFERED=1
out=${OUT:-/tmp/pagedkv-out}
logs=/tmp/pagedkv-logs  # what does not come back
mkdir -p "$out" "$logs"
mode=${1:-all}
gpu=$(nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv; date -u)
echo "$gpu"
if [[ $mode == all || $mode == test ]]; then
  # The tests are bound by their host references on one core each: test_decode_cuda runs in 8
  # gtest shards, beside the other binaries and compute-sanitizer, which took the whole set from
  # 400 to 85 s on the H100's 16 cores (2026-11-25). Timing is for the benchmarks below.
  shards=8
  for i in $(seq 0 $((shards - 1))); do
    { GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$i timeout 300 ./test_decode_cuda
      echo "test_decode_cuda shard $i rc=$?"; } > "$logs/decode.$i.log" 2>&1 &
  done
  { timeout 200 ./test_cache_ops_cuda; echo "test_cache_ops_cuda rc=$?"; } > "$logs/cache_ops.log" 2>&1 &
  { timeout 200 ./test_merge_cuda; echo "test_merge_cuda rc=$?"; } > "$logs/merge.log" 2>&1 &
  { timeout 200 ./test_kv_pool_cuda; echo "test_kv_pool_cuda rc=$?"; } > "$logs/kv_pool.log" 2>&1 &
  # kv_pool's 1 PiB allocation is left out: its failure is the test, and compute-sanitizer reports it.
  san="--gtest_filter=DecodeCuda.SmallMixedForSanitizers:DecodeCuda.LooseMaxKvLen:DecodeCuda.PairedKvHeads:CacheOpsCuda.*:MergeCuda.PaddedMisalignedAndInPlace:KvPoolCuda.*-KvPoolCuda.AShortDeviceNamesTheCallAndTheSize"
  for tool in memcheck racecheck; do
    for bin in test_cache_ops_cuda test_decode_cuda test_merge_cuda test_kv_pool_cuda; do
      { echo "== compute-sanitizer --tool $tool ./$bin $san"
        timeout 280 compute-sanitizer --tool $tool --error-exitcode 99 ./$bin "$san" 2>&1 | grep -vE "^\[ +(RUN|OK) " | tail -8
        echo "rc=${PIPESTATUS[0]}"; } > "$logs/san.$tool.$bin.log" 2>&1 &
    done
  done
  wait
  { echo "$gpu"; cat "$logs/cache_ops.log" "$logs/merge.log" "$logs/kv_pool.log"
    for i in $(seq 0 $((shards - 1))); do cat "$logs/decode.$i.log"; done
    for tool in memcheck racecheck; do
      for bin in test_cache_ops_cuda test_decode_cuda test_merge_cuda test_kv_pool_cuda; do cat "$logs/san.$tool.$bin.log"; done
    done; } > "$out/tests.log"
  grep -E "rc=|PASSED|FAILED|Failure|SKIPPED|note" "$out/tests.log" | grep -v "^== " | head -40
  grep -E "^== |ERROR SUMMARY|RACECHECK SUMMARY" "$out/tests.log"
fi
if [[ $mode == all || $mode == bench ]]; then
  timeout 280 ./bench_decode --benchmark_out="$out/bench_decode.json" --benchmark_out_format=json \
    --benchmark_counters_tabular=true > "$logs/bench.log" 2>&1; echo "bench_decode rc=$?"
  timeout 120 ./bench_stream 20 > "$out/stream.csv" 2>&1; echo "bench_stream rc=$?"
  timeout 120 ./bench_cache_ops --benchmark_out="$out/cache_ops.json" --benchmark_out_format=json \
    --benchmark_counters_tabular=true > "$logs/cache_ops.log" 2>&1; echo "bench_cache_ops rc=$?"
  timeout 120 python3 sdpa_peer.py "$out/sdpa.json" > /dev/null 2>&1; echo "sdpa rc=$?"
  timeout 300 python3 merge_peer.py "$logs/merge_peer.json" > "$logs/merge_peer.log" 2>&1; echo "merge peer rc=$?"
  fi_args=()
  if python3 -c "import flashinfer" 2>/dev/null; then  # when its wheel was carried and installed
    timeout 400 python3 flashinfer_peer.py "$out/flashinfer.json" > "$logs/flashinfer.log" 2>&1
    echo "flashinfer rc=$?"; tail -3 "$logs/flashinfer.log"
    [[ -s $out/flashinfer.json ]] && fi_args=(--flashinfer "$out/flashinfer.json")
  fi
  { echo "<!--"; echo "$gpu"; echo "-->"
    python3 report.py "$out/bench_decode.json" "$out/sdpa.json" "$out/decode.png" "${fi_args[@]}"
    echo; echo "### merge_states (bench_cache_ops, merge_peer.py)"; echo
    python3 merge_report.py "$out/cache_ops.json" "$logs/merge_peer.json"; } > "$out/report.md"
  echo "report rc=$?"
  cat "$out/report.md"
fi
