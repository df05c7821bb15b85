#!/usr/bin/env bash
# llama3-8b, the issue-20 workload, three builds alternating twice (run ab1 of 2026-11-26), from a
# carried folder holding blas.tar.xz and llama-new (main at 602cea0), llama-3201f58 (the session
# before's last commit) and llama-base (run f1's build). Writes under $OUT.
set -u
cd "$(dirname "$0")"
mkdir -p lib && tar xJf blas.tar.xz -C lib
export LD_LIBRARY_PATH=$PWD/lib:$PWD
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u
common=(--device cuda --bench --bench-requests 256 --bench-length-scale 1 --bench-max-prompt 1024
        --max-tokens 1024 --max-batch-tokens 2048 --max-num-seqs 256 --seed 1 --model-shape llama3-8b)
for round in 1 2; do for b in new 3201f58 base; do
  echo "== $b round $round" >> $OUT/ab.log
  timeout 80 ./llama-$b "${common[@]}" >> $OUT/ab.log 2>/dev/null; echo "rc=$?" >> $OUT/ab.log
done; done
grep -E "^==|output tokens/s|decode step|decode batch|prefill steps|rc=" $OUT/ab.log
date -u
