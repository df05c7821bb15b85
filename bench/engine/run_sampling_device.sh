#!/usr/bin/env bash
# Sampling on the GPU, in one device call: the CUDA backend's sampling tests (the GPU sampler
# against the host definition on fresh random rows, and inside the backend comparison), then
# pagedkv-llama --bench on a random llama2-7b, greedy beside temperature sampling, same workload.
# Run from a folder holding pagedkv-llama, test_cuda_backend, blas.tar.xz and the shared libraries
# pagedkv-llama needs beyond the device's (libcpp-httplib and what it links: ssl, crypto, brotli);
# PAGEDKV_GOLDEN_DIR names the tests' golden folder. Writes its log under $OUT.
#   run_sampling_device.sh [test | bench | all]
set -u
cd "$(dirname "$0")"
mkdir -p lib && tar xJf blas.tar.xz -C lib
export LD_LIBRARY_PATH=$PWD/lib:$PWD
out=${OUT:-/tmp/pagedkv-out}
mkdir -p "$out"
log=$out/sampling.log
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; date -u; } | tee "$log"
mode=${1:-all}
if [[ $mode == all || $mode == test ]]; then
timeout 90 ./test_cuda_backend --gtest_filter='CudaBackend.Sampling*:CudaBackend.DecodeKernelShapes*:CudaBackend.TinyHf*:CudaBackend.SwapPreemption*' \
  >> "$log" 2>&1
echo "test_cuda_backend rc=$?" >> "$log"
grep -E "rc=|OK|FAILED|Failure|draws|seed" "$log" | head -40
fi
[[ $mode == all || $mode == bench ]] || exit 0
common=(--device cuda --model-shape llama2-7b --bench --bench-requests 256 --bench-length-scale 1
        --bench-max-prompt 1024 --max-tokens 1024 --max-batch-tokens 2048 --max-num-seqs 256 --seed 1)
for sampling in "--temperature 0" "--temperature 1 --top-k 50 --top-p 0.9" "--temperature 0.8"; do
  echo "== pagedkv-llama llama2-7b $sampling" >> "$log"
  # shellcheck disable=SC2086
  timeout 60 ./pagedkv-llama "${common[@]}" $sampling >> "$log" 2>"$out/bench.err"
  echo "rc=$?" >> "$log"
  tail -2 "$out/bench.err" >> "$log"
done
grep -E "^==|rc=|output tokens/s|decode step|TPOT|GPU idle|steps" "$log" | tail -40
