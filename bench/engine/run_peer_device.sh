#!/usr/bin/env bash
# pagedkv-llama and transformers' continuous batching on the same requests, in one device call:
# the issue-20 workload on llama2-7b and llama3-8b. Run from a folder holding pagedkv-llama,
# blas.tar.xz and httplib.tar.xz (run_device.sh says what they hold), placed at build/<name> of a
# checkout (it runs ../../bench/engine/hf_peer.py); with test_llama_engine and test_cuda_backend
# beside them it runs their GPU cases first. Writes at most 7 files under $OUT.
set -u
source "$(dirname "$0")/../../bench/engine/carried_env.sh"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv; date -u
if [[ -x ./test_llama_engine && -x ./test_cuda_backend ]]; then
  { timeout 120 ./test_llama_engine --gtest_filter='*cuda*'; echo "test_llama_engine (cuda) rc=$?"
    timeout 120 ./test_cuda_backend; echo "test_cuda_backend rc=$?"; } > $out/tests.log 2>&1
  grep -E "FAILED|rc=" $out/tests.log
fi
common=(--device cuda --bench --bench-requests 256 --bench-length-scale 1 --bench-max-prompt 1024
        --max-tokens 1024 --max-batch-tokens 2048 --max-num-seqs 256 --seed 1)
for shape in llama2-7b llama3-8b; do
  timeout 120 ./pagedkv-llama "${common[@]}" --model-shape $shape --bench-workload-out /tmp/workload_$shape.json > $out/pagedkv_$shape.log 2> /tmp/pagedkv_$shape.err
  echo "== pagedkv $shape rc=$?"; grep -E "output tokens/s|roofline|decode batch|GPU idle" $out/pagedkv_$shape.log
done
for shape in llama2-7b llama3-8b; do
  timeout 230 python3 ../../bench/engine/hf_peer.py --shape $shape --workload /tmp/workload_$shape.json --out $out/hf_$shape.json > $out/hf_$shape.log 2>&1
  echo "== transformers $shape rc=$?"; tail -2 $out/hf_$shape.log
done
date -u
