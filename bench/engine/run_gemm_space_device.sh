#!/usr/bin/env bash
# cuBLASLt's algorithm space for the decode products of llama3-8b (rows 64, 128, 200, 256) and
# llama2-7b (128, 200), each candidate timed on cold weights against the heuristic's choice and the
# read ceiling (bench/engine/gemm_space.cu says how), in one device call (helper lt, session 6, run
# lt1). Run from a carried folder holding gemm_space (built as its header says). Writes the logs
# and the best configs per (shape, rows) (the files of --gemm-candidates, since removed) under $OUT.
set -u
cd "$(dirname "$0")" || exit 1
out=${OUT:-/tmp/out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; date -u
timeout 230 ./gemm_space --budget ${BUDGET:-4} --rows 64,128,200,256 --out "$out/cand_llama3-8b.txt" \
  4096:6144 4096:4096 14336:4096 4096:28672 > "$out/space_llama3-8b.log" 2>&1
echo "== llama3-8b rc=$? $(date -u +%T)"
timeout 110 ./gemm_space --budget ${BUDGET:-4} --rows 128,200 --out "$out/cand_llama2-7b.txt" \
  4096:12288 11008:4096 4096:22016 > "$out/space_llama2-7b.log" 2>&1
echo "== llama2-7b rc=$? $(date -u +%T)"
grep -hE "^device|^read ceiling|^[0-9]+:[0-9]+|enumeration stopped|dropped" "$out/space_llama3-8b.log" "$out/space_llama2-7b.log"
