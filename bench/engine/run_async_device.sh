#!/usr/bin/env bash
# Asynchronous scheduling on the GPU, in one device call: the engine's invariance tests on the
# CUDA backend (greedy tokens with async scheduling on and off, EOS discarding, every sampling
# mode), compute-sanitizer memcheck over the async tests, then issue 20's workload with async
# scheduling on and off on both shapes, and llama3-8b at --max-num-seqs 64 and 128 (the decode
# step against its roofline by batch bucket). Run from a folder holding pagedkv-llama,
# test_llama_engine, test_cuda_backend, blas.tar.xz and httplib.tar.xz (run_device.sh says what
# they hold); writes tests.log, memcheck.log and bench.log under $OUT.
set -u
source "$(dirname "$0")/../../bench/engine/carried_env.sh"
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv; date -u; } | tee "$out/bench.log"
{ timeout 200 ./test_llama_engine --gtest_filter='*cuda*'; echo "test_llama_engine (cuda) rc=$?"
  timeout 200 ./test_cuda_backend; echo "test_cuda_backend rc=$?"; } > "$out/tests.log" 2>&1
grep -E "OK \]|FAILED|SKIPPED|Failure|rc=" "$out/tests.log" | head -40
timeout 200 compute-sanitizer --tool memcheck --error-exitcode 99 ./test_llama_engine \
  --gtest_filter='*async*cuda*:*discards*cuda*' > "$out/memcheck.log" 2>&1
echo "memcheck rc=$?"; tail -2 "$out/memcheck.log"
common=(--device cuda --bench --bench-requests 256 --bench-length-scale 1 --bench-max-prompt 1024
        --max-tokens 1024 --max-batch-tokens 2048 --seed 1)
run() {  # shape, then flags
  local shape=$1; shift
  echo "== pagedkv-llama --model-shape $shape $*" >> "$out/bench.log"
  timeout 120 ./pagedkv-llama "${common[@]}" --model-shape "$shape" "$@" >> "$out/bench.log" 2>/tmp/bench.err
  echo "rc=$?" >> "$out/bench.log"; tail -2 /tmp/bench.err >> "$out/bench.log"
}
for shape in llama2-7b llama3-8b; do
  run $shape --max-num-seqs 256
  run $shape --max-num-seqs 256 --no-async-scheduling
done
run llama3-8b --max-num-seqs 64
run llama3-8b --max-num-seqs 128
date -u >> "$out/bench.log"
grep -E "^==|^rc=|output tokens/s|decode step|decode batch|roofline|GPU idle|async scheduling" "$out/bench.log"
