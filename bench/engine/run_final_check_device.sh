#!/usr/bin/env bash
# A whole check of main in one call on two GPUs (kind nvidia-h100-x2), run from a carried folder at
# build/<name> of the checkout holding pagedkv-llama, test_llama_engine, test_cuda_backend,
# test_tp_backend, blas.tar.xz (run_tp_device.sh says what it holds) and base/pagedkv-llama (an
# earlier build to compare against; run f1 of 2026-11-26 carried run g13's): TP's tests and failure
# tests and test_cuda_backend (run_tp_device.sh test), test_llama_engine's CUDA cases, compute-
# sanitizer memcheck over the decode-graph and one-token cases, llama2-13b TP2 (graphs; eager) and
# TP1, then llama3-8b and llama2-7b on one GPU, this build against base/pagedkv-llama. Writes under
# $OUT.
set -u
cd "$(dirname "$0")"
cp ../../bench/engine/run_tp_device.sh . 2>/dev/null || true
OUT=$OUT/tp TEST_TIMEOUT=120 FAIL_LIMIT=20 BENCH_TIMEOUT=70 bash ./run_tp_device.sh test llama2-13b
mkdir -p lib && tar xJf blas.tar.xz -C lib
nccl_dir=$(python3 -c "import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__))" 2>/dev/null)/lib
export LD_LIBRARY_PATH=$PWD/lib:$PWD:$nccl_dir NCCL_NVLS_ENABLE=0
export PAGEDKV_GOLDEN_DIR=${PAGEDKV_GOLDEN_DIR:-$(cd ../../tests/runner/golden && pwd)}
log=$OUT/final.log
{ timeout 90 ./test_llama_engine --gtest_filter='*cuda*'; echo "test_llama_engine (cuda) rc=$?"
  timeout 240 compute-sanitizer --tool memcheck --error-exitcode 99 ./test_cuda_backend \
    --gtest_filter='*DecodeGraphs*:*OneToken*:*Tuned*:*ReservedSteps*'; echo "memcheck test_cuda_backend rc=$?"; } > "$OUT/tests.log" 2>&1
grep -E "PASSED|FAILED|ERROR SUMMARY|rc=" "$OUT/tests.log"
common=(--device cuda --bench --bench-requests 256 --bench-length-scale 1 --bench-max-prompt 1024
        --max-tokens 1024 --max-batch-tokens 2048 --max-num-seqs 256 --seed 1)
one() {  # NAME BINARY ARGS...
  local name=$1 bin=$2; shift 2
  echo "== $name: $bin $*" >> "$log"
  timeout 80 "$bin" "${common[@]}" "$@" >> "$log" 2> "/tmp/$name.err"; echo "rc=$?" >> "$log"; tail -2 "/tmp/$name.err" >> "$log"
}
one 13b_tp2 ./pagedkv-llama --model-shape llama2-13b --tensor-parallel-size 2
one 13b_tp2_eager ./pagedkv-llama --model-shape llama2-13b --tensor-parallel-size 2 --enforce-eager
one 13b_tp1 ./pagedkv-llama --model-shape llama2-13b
one 8b_new ./pagedkv-llama --model-shape llama3-8b
one 8b_base base/pagedkv-llama --model-shape llama3-8b
one 7b_new ./pagedkv-llama --model-shape llama2-7b
one 7b_base base/pagedkv-llama --model-shape llama2-7b
grep -E "^==|output tokens/s|decode step|decode batch (64|96|128|192)|prefill|all-reduces took|arrived last|growths|rc=" "$log"
