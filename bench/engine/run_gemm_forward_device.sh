#!/usr/bin/env bash
# Where a decode product's time goes in the forward (bench/engine/gemm_forward.cu says what it
# times): llama3-8b's and llama2-7b's four products over 32 layers' weights, alone, back to back
# in forward order, and between stand-ins for the norm, attention (the bench's mean K/V bytes a
# layer at >= 64 sequences) and SwiGLU. Prepared by helper lt (session 6), not run yet. Run from a
# carried folder holding gemm_forward (built as its header says); about 30 s. Writes under $OUT.
set -u
cd "$(dirname "$0")" || exit 1
out=${OUT:-/tmp/out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; date -u
timeout 120 ./gemm_forward --rows 64,128,200,256 --dim 4096 --qkv 6144 --ffn 14336 --layers 32 --kv-mb 190 \
  2>&1 | tee "$out/forward_llama3-8b.log"
timeout 120 ./gemm_forward --rows 64,128,200,256 --dim 4096 --qkv 12288 --ffn 11008 --layers 32 --kv-mb 720 \
  2>&1 | tee "$out/forward_llama2-7b.log"
