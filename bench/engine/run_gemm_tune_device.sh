#!/usr/bin/env bash
# Whole-step GEMM tuning with cuBLASLt's enumerated algorithms against the heuristic's candidates
# (helper lt, session 6, run lt2), one device call, one binary. It needs the build of the commit
# "tuning: full cuBLASLt configs in the file, --gemm-candidates to try", whose --gemm-candidates
# lt2 measured as no gain and a later commit removed (docs/journal/engine-gpu.md, session 6).
# It runs the engine's GPU tests and compute-sanitizer memcheck over the tuned-graph,
# decode-graph and one-token cases (stops if they fail); then issue 20's workload on llama3-8b
# and llama2-7b untuned, tuned over the heuristic's first 5 (--tune-gemms, a run that tunes and writes, then one that reads), and tuned over the
# heuristic's first 3 plus the best 4 full configs per (shape, nearest rows) of run lt1's
# gemm_space (--gemm-candidates cand_*.txt beside this script, bench/engine/results/
# 2026-11-26-h100-lt1-*), written and read the same way; llama3-8b untuned again last. Run from a
# carried folder at build/<name> holding engine.tar.xz (pagedkv-llama, test_cuda_backend,
# test_llama_engine, stripped), blas.tar.xz and httplib.tar.xz (run_device.sh says how they are
# made) and the candidate files. Writes 4 files under $OUT.
set -u
source "$(dirname "$0")/../../bench/engine/carried_env.sh"
tar xJf engine.tar.xz || exit 1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; date -u
engine_tests_and_memcheck '*OneToken*:*Tuned*:*DecodeGraphs*' 'batches tuned|RUN' || { echo "tests failed: stopping"; exit 1; }
common=(--device cuda --bench --bench-requests 256 --bench-length-scale 1 --bench-max-prompt 1024 --max-tokens 1024
        --max-batch-tokens 2048 --max-num-seqs 256 --seed 1)
run() {  # shape, name, more flags
  timeout 110 ./pagedkv-llama "${common[@]}" --model-shape "$1" "${@:3}" > "/tmp/$2.log" 2> "/tmp/$2.err"
  echo "== $2 rc=$? $(date -u +%T)" | tee -a "$out/bench.log"; cat "/tmp/$2.log" >> "$out/bench.log"; tail -3 "/tmp/$2.err"
  grep -E "output tokens/s|step / roofline|decode batch (64|96|128|192)|GEMM tuning" "/tmp/$2.log"
}
tuned() {  # shape, name, tuning flags: tunes into /tmp/NAME.txt, then reads it
  run "$1" "$2_tuning" --tune-gemms "/tmp/$2.txt" "${@:3}"
  run "$1" "$2" --tune-gemms "/tmp/$2.txt"
  { echo "== $2"; cat "/tmp/$2.txt"; } >> "$out/tunings.txt"
}
cat cand_llama2-7b.txt <(grep -E "^4096 4096 " cand_llama3-8b.txt) > /tmp/cand_llama2-7b_all.txt
run llama3-8b 8b_untuned
tuned llama3-8b 8b_heur5 --tune-gemm-candidates 5
tuned llama3-8b 8b_space --tune-gemm-candidates 3 --gemm-candidates cand_llama3-8b.txt
run llama3-8b 8b_untuned2
run llama2-7b 7b_untuned
tuned llama2-7b 7b_heur5 --tune-gemm-candidates 5
tuned llama2-7b 7b_space --tune-gemm-candidates 3 --gemm-candidates /tmp/cand_llama2-7b_all.txt
date -u
