#!/usr/bin/env bash
# The host tier's copies on the GPU in one call (issue 23, measurement 2): bench_tier_copy offloads
# and loads 256 blocks of the LLaMA-2-7B shape between pinned host and device memory, per range,
# batched and staged (the engine's swap path), against a cudaMemcpy ceiling measured in the same
# run; test_cache_ops_cuda checks the cache operations (staged_swap included) first. Modes:
#   build   configure build/tier-device from this source tree (Release, sm_90a, no examples) and
#           build bench_tier_copy and test_cache_ops_cuda into build/tier-device/bin with
#           libbenchmark beside them (run it here: the GPU machine lacks Google Benchmark; carry
#           the bin folder)
#   run     run them from build/tier-device/bin (building first where they are missing); writes
#           $OUT/tier-gpu.txt, $OUT/test_cache_ops_cuda.log, $OUT/bench_tier_copy.json and
#           $OUT/bench_tier_copy.log
# From the repository root: bash bench/kernels/run_tier_device.sh build (here), then on the GPU
# machine, carrying build/tier-device/bin: bash bench/kernels/run_tier_device.sh run
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$root/build/tier-device
bin=${PAGEDKV_TIER_BIN:-$build/bin}
out=${OUT:-/tmp/pagedkv-tier-out}
logs=/tmp/pagedkv-tier-logs
mode=${1:-run}
mkdir -p "$out" "$logs"

build_binary() {
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
    -DPAGEDKV_BUILD_EXAMPLES=OFF -DPAGEDKV_BUILD_TESTS=ON > "$logs/configure.log" 2>&1 ||
    { echo "configure failed"; tail -20 "$logs/configure.log"; return 1; }
  cmake --build "$build" -j "$(nproc)" --target bench_tier_copy test_cache_ops_cuda > "$logs/build.log" 2>&1 ||
    { echo "build failed"; grep -E "error|FAILED" "$logs/build.log" | head -40; return 1; }
  mkdir -p "$bin"
  cp "$build/bench/kernels/bench_tier_copy" "$build/tests/kernels/test_cache_ops_cuda" "$bin/"
  ldd "$bin/bench_tier_copy" | awk '/libbenchmark/ { print $3 }' | xargs -r -I{} cp -L {} "$bin/"
  echo "built: $(ls "$bin" | tr '\n' ' ')"
}

if [[ $mode == build ]]; then
  build_binary
  exit $?
fi
[[ -x $bin/bench_tier_copy && -x $bin/test_cache_ops_cuda ]] || build_binary || exit 1
cd "$bin" || exit 1
export LD_LIBRARY_PATH=$bin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
{ nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current,clocks.mem \
    --format=csv; date -u; } | tee "$out/tier-gpu.txt"
timeout 60 ./test_cache_ops_cuda > "$out/test_cache_ops_cuda.log" 2>&1
echo "test_cache_ops_cuda rc=$?"
grep -E "^\[  (PASSED|FAILED|SKIPPED) |Failure|^\[==" "$out/test_cache_ops_cuda.log"
timeout 200 ./bench_tier_copy --benchmark_out="$out/bench_tier_copy.json" --benchmark_out_format=json \
  --benchmark_counters_tabular=true > "$out/bench_tier_copy.log" 2>&1
echo "bench_tier_copy rc=$?"
cat "$out/bench_tier_copy.log"
