#!/usr/bin/env bash
# Where a prefill step of issue 20's workload spends its time (llama2-7b), in one device call:
# cuBLASLt's candidates for the four products at 2027 rows, each timed alone (gemm_candidates,
# bench/engine/gemm_candidates.cu), then a kernel-time profile (ncu) of two of the run's 19 steps
# with prompt tokens (steps 9 and 10: about 2040 tokens, ~130 decodes beside ~14 prompt chunks)
# and of decode step 200 (about 150 sequences), through pagedkv-llama --profile-steps. Run from a
# folder holding pagedkv-llama, gemm_candidates, blas.tar.xz and httplib.tar.xz (run_device.sh's
# header says what they hold). Writes at most 3 files under $OUT.
set -u
source "$(dirname "$0")/../../bench/engine/carried_env.sh"
nvidia-smi --query-gpu=name,driver_version --format=csv; date -u
timeout 60 ./gemm_candidates 2027 4096:12288 4096:4096 4096:22016 11008:4096 > "$out/gemm_candidates.log" 2>&1
echo "== gemm_candidates rc=$?"
grep -E "^==|\*" "$out/gemm_candidates.log"
common=(--device cuda --bench --bench-requests 256 --bench-length-scale 1 --bench-max-prompt 1024
        --max-tokens 1024 --max-batch-tokens 2048 --max-num-seqs 256 --seed 1 --model-shape llama2-7b)
timeout 200 ncu --profile-from-start off --clock-control none --cache-control none --metrics gpu__time_duration.sum \
  --csv --print-units base ./pagedkv-llama "${common[@]}" --profile-steps 9,10,200 > "$out/ncu_steps.csv" 2> /tmp/ncu.err
echo "== ncu rc=$? $(wc -l < "$out/ncu_steps.csv") lines"; tail -3 /tmp/ncu.err
grep -E "output tokens/s|prefill steps" "$out/ncu_steps.csv"
date -u
