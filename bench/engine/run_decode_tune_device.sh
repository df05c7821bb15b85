#!/usr/bin/env bash
# Issue 20's llama3-8b decode step against its roofline, and the prefill step's host time, in one
# device call (helper engine3, session 5): the engine's GPU tests and compute-sanitizer memcheck
# over the cases of the new code (stops if they fail); issue 20's workload with the build before
# (base/pagedkv-llama) and the new one on both shapes (the new one sizes its step buffers once and
# prints each prefill step's device and host time); llama3-8b with --tune-gemms (a run that tunes
# and writes the choices, then a run that reads them, then the build before again); and a
# kernel-time profile (ncu) of llama3-8b's decode steps 120 and 232 (about 200 and 128 sequences)
# with the heuristic's choices. Run from a folder laid out as run_peer_device.sh's, with the build
# before in base/. Writes at most 6 files under $OUT.
set -u
source "$(dirname "$0")/../../bench/engine/carried_env.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; date -u
{ timeout 60 ./test_llama_engine --gtest_filter='*cuda*'; echo "test_llama_engine (cuda) rc=$?"
  timeout 90 ./test_cuda_backend; echo "test_cuda_backend rc=$?"; } > "$out/tests.log" 2>&1
grep -E "FAILED|rc=|batches tuned" "$out/tests.log"
sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
{ timeout 90 "$sanitizer" --tool memcheck --error-exitcode 99 ./test_cuda_backend \
    --gtest_filter='*OneToken*:*Tuned*'; echo "memcheck test_cuda_backend rc=$?"; } > "$out/memcheck.log" 2>&1
grep -E "ERROR SUMMARY|rc=" "$out/memcheck.log"
grep -q "rc=[1-9]" "$out/tests.log" "$out/memcheck.log" && { echo "tests failed: stopping"; exit 1; }
common=(--device cuda --bench --bench-requests 256 --bench-length-scale 1 --bench-max-prompt 1024 --max-tokens 1024
        --max-batch-tokens 2048 --max-num-seqs 256 --seed 1)
run() {  # binary, shape, name, more flags
  timeout 90 "$1" "${common[@]}" --model-shape "$2" "${@:4}" > "/tmp/$3.log" 2> "/tmp/$3.err"
  echo "== $3 rc=$? $(date -u +%T)" | tee -a "$out/bench.log"; cat "/tmp/$3.log" >> "$out/bench.log"
  grep -E "output tokens/s|step / roofline|decode batch (64|96|128|192)|prefill steps|prefill GPU|GEMM tuning" "/tmp/$3.log"
}
run base/pagedkv-llama llama3-8b llama3-8b_base
run ./pagedkv-llama llama3-8b llama3-8b_new
run ./pagedkv-llama llama2-7b llama2-7b_new
run base/pagedkv-llama llama2-7b llama2-7b_base
run ./pagedkv-llama llama3-8b llama3-8b_tuning --tune-gemms /tmp/gemm_llama3-8b.txt
cp /tmp/gemm_llama3-8b.txt "$out/gemm_llama3-8b.txt"
run ./pagedkv-llama llama3-8b llama3-8b_tuned --tune-gemms /tmp/gemm_llama3-8b.txt
run base/pagedkv-llama llama3-8b llama3-8b_base2
timeout 120 ncu --profile-from-start off --clock-control none --cache-control none --metrics gpu__time_duration.sum \
  --csv --print-units base ./pagedkv-llama "${common[@]}" --model-shape llama3-8b --profile-steps 120,232 \
  > "$out/ncu_llama3-8b.csv" 2> /tmp/ncu.err
echo "== ncu rc=$? $(wc -l < "$out/ncu_llama3-8b.csv") lines"; tail -2 /tmp/ncu.err
date -u
