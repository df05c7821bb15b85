#!/usr/bin/env bash
# One-GPU checks (run f2 of docs/benchmarks.md; run_final_prefill_device.sh calls it as final3.sh
# from its folder, beside the binaries and blas.tar.xz): the sampling test at the seed that failed
# in run f1 and at fresh seeds, test_cuda_backend and test_llama_engine's CUDA cases, and --tune-
# gemms writing a file, reading it back, and refusing it with another GPU's target line.
set -u
cd "$(dirname "$0")"
mkdir -p lib && tar xJf blas.tar.xz -C lib
export LD_LIBRARY_PATH=$PWD/lib:$PWD PAGEDKV_GOLDEN_DIR=$(cd ../../tests/runner/golden && pwd)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u
{ PAGEDKV_SAMPLING_SEED=3331665508 timeout 60 ./test_cuda_backend --gtest_filter='*Sampling*'; echo "sampling at seed 3331665508 rc=$?"
  timeout 120 ./test_cuda_backend --gtest_filter='*Sampling*' --gtest_repeat=4; echo "sampling x4 rc=$?"
  timeout 150 ./test_cuda_backend; echo "test_cuda_backend rc=$?"
  timeout 90 ./test_llama_engine --gtest_filter='*cuda*'; echo "test_llama_engine (cuda) rc=$?"; } > "$OUT/tests.log" 2>&1
grep -E "seed|PASSED|FAILED|rc=" "$OUT/tests.log" | grep -vE "^\[       OK" | head -40
small=(--device cuda --model-shape llama2-7b --bench --bench-requests 96 --max-tokens 48 --max-num-seqs 96 --seed 1)
{ timeout 90 ./pagedkv-llama "${small[@]}" --tune-gemms /tmp/tune.txt; echo "tune write rc=$?"
  timeout 60 ./pagedkv-llama "${small[@]}" --tune-gemms /tmp/tune.txt; echo "tune read rc=$?"
  cp /tmp/tune.txt "$OUT/tune.txt"
  sed 's/^target .*/target NVIDIA A100-SXM4-80GB sm_80 cublasLt 120000/' /tmp/tune.txt > /tmp/tune-other.txt
  timeout 60 ./pagedkv-llama "${small[@]}" --tune-gemms /tmp/tune-other.txt; echo "tune other GPU rc=$? (2 expected)"; } > "$OUT/tune.log" 2>&1
grep -iE "tun|target|refus|rc=|output tokens/s" "$OUT/tune.log" | head -20; head -3 "$OUT/tune.txt"
