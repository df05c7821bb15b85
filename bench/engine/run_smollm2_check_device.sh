#!/usr/bin/env bash
# The engine's whole GPU check with the real model (run s7 of docs/journal/engine-gpu.md), on two
# GPUs (kind nvidia-h100-x2): test_cuda_backend with SmolLM2-135M against transformers' goldens,
# the TP tests and failure tests (run_tp_device.sh test), test_llama_engine's CUDA cases,
# compute-sanitizer memcheck, the main job (SmolLM2 answers the README's prompt) on the GPU, then
# llama3-8b and llama2-7b on the issue-20 workload. Writes tests.log, tp.log and bench.log to $OUT.
#
# The model (98 MB) is larger than a call may carry (64 MiB with the tree), so it travels in halves
# on the same warm machine, each call within the 30 s the machine stays warm:
#   split -b 50000000 -d models/SmolLM2-135M-Instruct.Q4_1.gguf build/dev-a/smol.part  # part00 there
#   mv build/dev-a/smol.part01 build/dev-b/
#   call 1, carrying build/dev-a: cp build/dev-a/smol.part00 /tmp/
#   call 2, carrying build/dev-b: cp build/dev-b/smol.part01 /tmp/
#   call 3, carrying build/dev-c: bash build/dev-c/run_smollm2_check_device.sh
# build/dev-c holds this script, bins.tar.xz (pagedkv-llama, test_cuda_backend, test_tp_backend,
# test_llama_engine of a release sm_90a build) and blas.tar.xz (run_tp_device.sh says what).
set -u
cd "$(dirname "$0")"
tar xJf bins.tar.xz
cat /tmp/smol.part00 /tmp/smol.part01 > /tmp/smol.gguf
echo "SmolLM2 sha256 $(sha256sum /tmp/smol.gguf | cut -c1-64) (scripts/fetch-model.sh names the expected one)"
export PAGEDKV_SMOLLM2=/tmp/smol.gguf
cp ../../bench/engine/run_tp_device.sh .
OUT=$OUT TEST_TIMEOUT=200 FAIL_LIMIT=40 bash ./run_tp_device.sh test
nccl_dir=$(python3 -c "import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__))" 2>/dev/null)/lib
export LD_LIBRARY_PATH=$PWD/lib:$PWD:$nccl_dir NCCL_NVLS_ENABLE=0
export PAGEDKV_GOLDEN_DIR=$(cd ../../tests/runner/golden && pwd)
{ timeout 90 ./test_llama_engine --gtest_filter='*cuda*'; echo "test_llama_engine (cuda) rc=$?"
  timeout 60 ./test_cuda_backend --gtest_filter='*SmolLM2*:*CopyOnWriteAtTheInputBound*'; echo "smol+cow rc=$?"
  timeout 300 compute-sanitizer --tool memcheck --error-exitcode 99 ./test_cuda_backend \
    --gtest_filter='*CopyOnWriteAtTheInputBound*:*DecodeGraphs*:*OneToken*:*ReservedSteps*:*Sampling*'; echo "memcheck test_cuda_backend rc=$?"
  timeout 60 ./pagedkv-llama --device cuda --model /tmp/smol.gguf --chat \
    --prompt "What is the capital of France? Answer in one sentence."; echo "main job on cuda rc=$?"
} > "$OUT/tests.log" 2>&1
grep -E "PASSED|FAILED|ERROR SUMMARY|rc=|SmolLM2 on|Paris|capital" "$OUT/tests.log"
common=(--device cuda --bench --bench-requests 256 --bench-length-scale 1 --bench-max-prompt 1024
        --max-tokens 1024 --max-batch-tokens 2048 --max-num-seqs 256 --seed 1)
for shape in llama3-8b llama2-7b; do
  { echo "== $shape"; timeout 100 ./pagedkv-llama "${common[@]}" --model-shape $shape 2>/tmp/$shape.err; echo "rc=$?"
    tail -3 /tmp/$shape.err; } >> "$OUT/bench.log"
done
grep -iE "==|output tok|decode step|roofline|idle|rc=" "$OUT/bench.log" | head -40
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u
