#!/usr/bin/env bash
# Where a run of issue 20's workload spends its time, in one device call: the engine's GPU tests
# first (stops if they fail), then pagedkv-llama --bench on both shapes with its per-step-kind
# breakdown ("decode batch" and "prefill steps" lines), llama2-7b again with a larger token budget
# a step, and a kernel-time profile (ncu) of a few decode steps of the run's tail (about 28
# sequences of long contexts). Run from a folder laid out as run_peer_device.sh's. Writes at most
# 7 files under $OUT.
set -u
source "$(dirname "$0")/../../bench/engine/carried_env.sh"
nvidia-smi --query-gpu=name,driver_version --format=csv; date -u
{ timeout 120 ./test_llama_engine --gtest_filter='*cuda*'; echo "test_llama_engine (cuda) rc=$?"
  timeout 120 ./test_cuda_backend; echo "test_cuda_backend rc=$?"; } > "$out/tests.log" 2>&1
grep -E "FAILED|rc=" "$out/tests.log"
grep -q "rc=[1-9]" "$out/tests.log" && { echo "tests failed: stopping"; exit 1; }
common=(--device cuda --bench --bench-requests 256 --bench-length-scale 1 --bench-max-prompt 1024
        --max-tokens 1024 --max-num-seqs 256 --seed 1)
run() {  # name, flags...
  local name=$1; shift
  timeout 90 ./pagedkv-llama "${common[@]}" "$@" > "$out/$name.log" 2> "/tmp/$name.err"
  echo "== $name rc=$?"; grep -E "output tokens/s|decode step|decode batch|prefill steps|GPU idle|^requests " "$out/$name.log"
}
run llama2-7b_b2048 --model-shape llama2-7b --max-batch-tokens 2048
run llama2-7b_b8192 --model-shape llama2-7b --max-batch-tokens 8192
run llama3-8b_b2048 --model-shape llama3-8b --max-batch-tokens 2048
# Kernel times of the tail: about 345 launches a decode step, so ~255000 skipped is step ~740.
timeout 150 ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv --print-units base \
  --launch-skip 255000 --launch-count 700 ./pagedkv-llama "${common[@]}" --model-shape llama2-7b --max-batch-tokens 2048 \
  > "$out/ncu_tail.csv" 2> /tmp/ncu.err
echo "== ncu rc=$? $(wc -l < "$out/ncu_tail.csv") lines"; tail -3 /tmp/ncu.err
date -u
