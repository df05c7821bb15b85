#!/usr/bin/env bash
# The prefill's GPU work in one call: its tests (test_prefill_plan, test_prefill_cuda in gtest
# shards, test_attention_step_cuda), compute-sanitizer memcheck and racecheck on the small test,
# then (once they pass) bench_prefill (JSON), its SDPA peer (prefill_peer.py: flash and cuDNN
# backends, same shapes) and the report (prefill_report.py -> prefill-report.md). Modes:
#   build            configure build/prefill-device from this source tree (Release, every
#                    instantiation, sm_90a) and build the four binaries into build/prefill-device/bin
#                    with libbenchmark beside them (run it where GTest, RapidCheck and Google
#                    Benchmark are installed; the GPU machine lacks them: carry the bin folder)
#   test|bench|all   run from build/prefill-device/bin (building first where it is missing); logs
#                    to $OUT: prefill-gpu.txt, prefill-tests.log, bench_prefill.json, bench_prefill.log,
#                    prefill-peer.json, prefill-report.md (bench and all run the peer and report)
# PAGEDKV_PREFILL_BIN=<folder> runs binaries carried elsewhere (e.g. build/carry-<name>).
# From the repository root: bash bench/kernels/run_prefill_device.sh build (here), then on the GPU
# machine, carrying build/prefill-device/bin: bash bench/kernels/run_prefill_device.sh all
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$root/build/prefill-device
bin=${PAGEDKV_PREFILL_BIN:-$build/bin}
bin=$(cd "$bin" 2>/dev/null && pwd || echo "$bin")
scripts=$root/bench/kernels
out=${OUT:-/tmp/pagedkv-prefill-out}
logs=/tmp/pagedkv-prefill-logs  # what does not come back
mode=${1:-all}
binaries=(test_prefill_plan test_prefill_cuda test_attention_step_cuda bench_prefill)
mkdir -p "$out" "$logs"

build_binaries() {
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DPAGEDKV_KERNELS_FULL_SWEEP=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90a -DPAGEDKV_BUILD_EXAMPLES=OFF > "$logs/configure.log" 2>&1 ||
    { echo "configure failed"; tail -20 "$logs/configure.log"; return 1; }
  cmake --build "$build" -j "$(nproc)" --target "${binaries[@]}" > "$logs/build.log" 2>&1 ||
    { echo "build failed"; grep -E "error|FAILED" "$logs/build.log" | head -40; return 1; }
  mkdir -p "$bin"
  cp "$build/tests/kernels/test_prefill_plan" "$build/tests/kernels/test_prefill_cuda" \
    "$build/tests/kernels/test_attention_step_cuda" "$build/bench/kernels/bench_prefill" "$bin/"
  # Google Benchmark's shared library, which the GPU machine does not have.
  ldd "$bin/bench_prefill" | awk '/libbenchmark/ { print $3 }' | xargs -r -I{} cp -L {} "$bin/"
  echo "built: $(ls "$bin" | tr '\n' ' ')"
}

if [[ $mode == build ]]; then
  build_binaries
  exit $?
fi
for b in "${binaries[@]}"; do
  [[ -x $bin/$b ]] || { build_binaries || exit 1; break; }
done
cd "$bin" || exit 1
export LD_LIBRARY_PATH=$bin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
gpu=$(nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv; date -u)
echo "$gpu" | tee "$out/prefill-gpu.txt"

# The tests first (the sanitizers beside them), stopping on a failure; then the benchmark on an
# idle GPU.
if [[ $mode == all || $mode == test ]]; then
  # The host reference is the bound: test_prefill_cuda runs in 8 gtest shards beside the other
  # binaries and compute-sanitizer.
  shards=8
  for i in $(seq 0 $((shards - 1))); do
    { GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$i timeout 240 ./test_prefill_cuda
      echo "test_prefill_cuda shard $i rc=$?"; } > "$logs/prefill.$i.log" 2>&1 &
  done
  { timeout 60 ./test_prefill_plan; echo "test_prefill_plan rc=$?"; } > "$logs/plan.log" 2>&1 &
  { timeout 240 ./test_attention_step_cuda; echo "test_attention_step_cuda rc=$?"; } > "$logs/step.log" 2>&1 &
  san="--gtest_filter=PrefillCuda.SmallMixedForSanitizers"
  for tool in memcheck racecheck; do
    { echo "== compute-sanitizer --tool $tool ./test_prefill_cuda $san"
      timeout 240 compute-sanitizer --tool $tool --error-exitcode 99 ./test_prefill_cuda "$san" 2>&1 |
        grep -vE "^\[ +(RUN|OK) " | tail -8
      echo "rc=${PIPESTATUS[0]}"; } > "$logs/san.$tool.log" 2>&1 &
  done
  wait
  { echo "$gpu"; cat "$logs/plan.log" "$logs/step.log"
    for i in $(seq 0 $((shards - 1))); do cat "$logs/prefill.$i.log"; done
    cat "$logs/san.memcheck.log" "$logs/san.racecheck.log"; } > "$out/prefill-tests.log"
  grep -E "rc=|PASSED|FAILED|Failure|SKIPPED|note|seed" "$out/prefill-tests.log" | grep -v "^== " | head -60
  grep -E "^== |ERROR SUMMARY|RACECHECK SUMMARY" "$out/prefill-tests.log"
  # A failed test stops the call before the timings: a wrong kernel's rate means nothing.
  if grep -qE "rc=[1-9]" "$out/prefill-tests.log"; then echo "tests failed: no bench"; exit 1; fi
fi
if [[ $mode == all || $mode == bench ]]; then
  timeout 200 ./bench_prefill --benchmark_out="$out/bench_prefill.json" --benchmark_out_format=json \
    --benchmark_counters_tabular=true > "$out/bench_prefill.log" 2>&1
  echo "bench_prefill rc=$?"
  grep -E "gemm|prefill" "$out/bench_prefill.log" | grep -v "variant:[1-9]" | head -30
  (cd "$scripts" && PYTHONUNBUFFERED=1 timeout 150 python3 prefill_peer.py "$out/prefill-peer.json") \
    > "$logs/peer.log" 2>&1
  echo "prefill_peer rc=$?"; tail -3 "$logs/peer.log"
  python3 "$scripts/prefill_report.py" "$out/bench_prefill.json" "$out/prefill-peer.json" > "$out/prefill-report.md"
  cat "$out/prefill-report.md"
fi
