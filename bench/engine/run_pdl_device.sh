#!/usr/bin/env bash
# Session 4's A/B of the decode graph's launch gaps (RoPE fused with the K/V write, RMSNorm and
# SwiGLU as programmatic dependent launches), in one device call: the engine's GPU tests and
# compute-sanitizer memcheck over the graph, fp8, swap and one-token cases of the new build (stops
# if they fail), then issue 20's workload on both shapes with the new pagedkv-llama and the one
# before (base/pagedkv-llama), alternating. With `peer`: also a build with the programmatic
# launches alone (pdl/pagedkv-llama, where present: RoPE and write_kv apart), and transformers'
# continuous batching (../../bench/engine/hf_peer.py) on llama2-7b's requests in the time left of
# 300 s (llama3-8b's peer, another 140 s, does not fit beside it). Run from a folder laid out as
# run_peer_device.sh's, with the build before in base/. Writes at most 7 files under $OUT.
set -u
source "$(dirname "$0")/../../bench/engine/carried_env.sh"
nvidia-smi --query-gpu=name,driver_version --format=csv; date -u
{ timeout 60 ./test_llama_engine --gtest_filter='*cuda*'; echo "test_llama_engine (cuda) rc=$?"
  timeout 90 ./test_cuda_backend; echo "test_cuda_backend rc=$?"; } > "$out/tests.log" 2>&1
grep -E "FAILED|rc=|near-tie" "$out/tests.log"
sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
{ timeout 100 "$sanitizer" --tool memcheck --error-exitcode 99 ./test_cuda_backend \
    --gtest_filter='*Swap*:*OneToken*:*DecodeGraphs*:*Fp8*:*DecodeKernelShapes*'; echo "memcheck test_cuda_backend rc=$?"
  timeout 60 "$sanitizer" --tool memcheck --error-exitcode 99 ./test_llama_engine --gtest_filter='*cuda*'
  echo "memcheck test_llama_engine rc=$?"; } > "$out/memcheck.log" 2>&1
grep -E "ERROR SUMMARY|rc=" "$out/memcheck.log"
grep -q "rc=[1-9]" "$out/tests.log" "$out/memcheck.log" && { echo "tests failed: stopping"; exit 1; }
common=(--device cuda --bench --bench-requests 256 --bench-length-scale 1 --bench-max-prompt 1024
        --max-tokens 1024 --max-batch-tokens 2048 --max-num-seqs 256 --seed 1)
run() {  # binary, shape, name, more flags
  timeout 60 "$1" "${common[@]}" --model-shape "$2" "${@:4}" > "/tmp/$3.log" 2> "/tmp/$3.err"
  echo "== $3 rc=$?" | tee -a "$out/bench.log"; cat "/tmp/$3.log" >> "$out/bench.log"
  grep -E "output tokens/s|step / roofline|decode batch" "/tmp/$3.log"
}
peer=$([[ ${1:-} == peer ]] && echo 1)
run ./pagedkv-llama llama2-7b llama2-7b_new --bench-workload-out /tmp/workload_llama2-7b.json
run base/pagedkv-llama llama2-7b llama2-7b_base
[[ $peer && -x pdl/pagedkv-llama ]] && run pdl/pagedkv-llama llama2-7b llama2-7b_pdl
run base/pagedkv-llama llama3-8b llama3-8b_base
run ./pagedkv-llama llama3-8b llama3-8b_new
[[ $peer && -x pdl/pagedkv-llama ]] && run pdl/pagedkv-llama llama3-8b llama3-8b_pdl
if [[ $peer ]]; then
  export PYTHONUNBUFFERED=1
  timeout $((290 - SECONDS)) python3 ../../bench/engine/hf_peer.py --shape llama2-7b --workload /tmp/workload_llama2-7b.json \
    --out "$out/hf_llama2-7b.json" > "$out/hf_llama2-7b.log" 2>&1
  echo "== transformers llama2-7b rc=$? after ${SECONDS} s"; tail -2 "$out/hf_llama2-7b.log"
fi
date -u
