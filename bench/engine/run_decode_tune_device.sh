#!/usr/bin/env bash
# Issue 20's llama3-8b decode step against its roofline, and the prefill step's host time, in one
# device call (helper engine3, session 5): the engine's GPU tests and compute-sanitizer memcheck
# over the cases of the new code (stops if they fail); issue 20's workload with the build before
# (base/pagedkv-llama) and the new one (which sizes its step buffers once and prints its prefill
# steps' device and host time); --tune-gemms on llama3-8b with run e1's choices (the heuristic's
# first 5 candidates, gemm_llama3-8b_e1.txt beside this script) and tuned afresh over the first 8
# (a run that tunes and writes, then one that reads), on llama2-7b over the first 5; the build
# before again last. Run from a folder laid out as run_peer_device.sh's, with the build before in
# base/. Writes at most 5 files under $OUT. Run e1 (6ab6eba, on main as bac9a64) was an earlier form: the same tests,
# base and new on both shapes, llama3-8b tuned over 5, and an ncu profile of its decode steps 120
# and 232 (`ncu --profile-from-start off --clock-control none --cache-control none --metrics
# gpu__time_duration.sum --csv --print-units base ./pagedkv-llama ... --profile-steps 120,232`).
set -u
source "$(dirname "$0")/../../bench/engine/carried_env.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; date -u
engine_tests_and_memcheck '*OneToken*:*Tuned*:*DecodeGraphs*' 'batches tuned|RUN' || { echo "tests failed: stopping"; exit 1; }
common=(--device cuda --bench --bench-requests 256 --bench-length-scale 1 --bench-max-prompt 1024 --max-tokens 1024
        --max-batch-tokens 2048 --max-num-seqs 256 --seed 1)
run() {  # binary, shape, name, more flags
  timeout 100 "$1" "${common[@]}" --model-shape "$2" "${@:4}" > "/tmp/$3.log" 2> "/tmp/$3.err"
  echo "== $3 rc=$? $(date -u +%T)" | tee -a "$out/bench.log"; cat "/tmp/$3.log" >> "$out/bench.log"
  grep -E "output tokens/s|step / roofline|decode batch (64|96|128|192)|prefill steps|prefill GPU|GEMM tuning" "/tmp/$3.log"
}
run base/pagedkv-llama llama3-8b llama3-8b_base
run ./pagedkv-llama llama3-8b llama3-8b_new
run ./pagedkv-llama llama3-8b llama3-8b_tuned5_e1 --tune-gemms gemm_llama3-8b_e1.txt
run ./pagedkv-llama llama3-8b llama3-8b_tuning8 --tune-gemms /tmp/gemm8_llama3-8b.txt --tune-gemm-candidates 8
cp /tmp/gemm8_llama3-8b.txt "$out/gemm8_llama3-8b.txt"
run ./pagedkv-llama llama3-8b llama3-8b_tuned8 --tune-gemms /tmp/gemm8_llama3-8b.txt
run base/pagedkv-llama llama3-8b llama3-8b_base2
run ./pagedkv-llama llama2-7b llama2-7b_tuning5 --tune-gemms /tmp/gemm5_llama2-7b.txt
cp /tmp/gemm5_llama2-7b.txt "$out/gemm5_llama2-7b.txt"
run ./pagedkv-llama llama2-7b llama2-7b_tuned5 --tune-gemms /tmp/gemm5_llama2-7b.txt
run base/pagedkv-llama llama2-7b llama2-7b_base
date -u
