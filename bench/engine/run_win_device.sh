#!/usr/bin/env bash
# Sliding-window models on the CUDA backend, and the engine's GPU tests, in one device call: every
# GPU case of test_cuda_backend (the Mistral and Ministral goldens against transformers included)
# and test_llama_engine, compute-sanitizer memcheck over the sliding-window cases alone (beside
# them, on the same GPU), and pagedkv-llama --device cuda --bench on the Ministral golden folder.
# Run from a folder two levels below a checkout (build/<name>, for ../../tests/runner/golden)
# holding pagedkv-llama, test_cuda_backend, test_llama_engine, blas.tar.xz and httplib.tar.xz
# (run_device.sh says what they hold). Writes tests.log, memcheck.log and bench.log under $OUT;
# within 180 s at worst (the timeouts: memcheck 170 s beside tests 100 + 50 s and the bench 20 s).
set -u
source "$(dirname "$0")/../../bench/engine/carried_env.sh"
{ nvidia-smi --query-gpu=name,driver_version --format=csv; date -u; } | tee "$out/tests.log"
sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
{ timeout 170 "$sanitizer" --tool memcheck --error-exitcode 99 ./test_cuda_backend \
    --gtest_filter='*CudaWindow*:CudaBackend.WindowedKernelShapes*' > "$out/memcheck.log" 2>&1
  echo "memcheck rc=$?" >> "$out/memcheck.log"; } &
{ timeout 100 ./test_cuda_backend; echo "test_cuda_backend rc=$?"
  timeout 50 ./test_llama_engine --gtest_filter='*cuda*'; echo "test_llama_engine (cuda) rc=$?"; } >> "$out/tests.log" 2>&1
timeout 20 ./pagedkv-llama --device cuda --model "$PAGEDKV_GOLDEN_DIR/hf_tiny/ministral" --bench --bench-requests 8 \
  --bench-max-prompt 100 --max-tokens 64 --seed 1 > "$out/bench.log" 2>&1
echo "pagedkv-llama ministral rc=$?" >> "$out/bench.log"
wait
grep -E "FAILED|Failure|rc=|PASSED|SKIPPED \] [0-9]|near-tie|positions|decode only" "$out/tests.log" | head -80
tail -4 "$out/memcheck.log"; grep -E "requests|rc=" "$out/bench.log"
date -u
