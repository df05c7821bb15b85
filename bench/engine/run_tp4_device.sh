#!/usr/bin/env bash
# TP4 on four H100s (kind nvidia-h100-x4): the issue-20 workload on llama2-13b at
# --tensor-parallel-size 4 (graphs; eager, every all-reduce timed) and 1, and llama3-8b at 4. Run
# from a carried folder at build/<name> holding engine.tar.xz (pagedkv-llama) and blas.tar.xz
# (run_tp_device.sh says what it holds); writes tp4.log under $OUT.
set -u
cd "$(dirname "$0")" && tar xJf engine.tar.xz && mkdir -p lib && tar xJf blas.tar.xz -C lib || exit 1
nccl_dir=$(python3 -c "import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__))" 2>/dev/null)/lib
export LD_LIBRARY_PATH=$PWD/lib:$PWD:$nccl_dir NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader; nvidia-smi topo -m | head -6; date -u
common=(--device cuda --bench --bench-requests 256 --bench-length-scale 1 --bench-max-prompt 1024
        --max-tokens 1024 --max-batch-tokens 2048 --max-num-seqs 256 --seed 1)
one() {  # NAME ARGS...
  local name=$1; shift
  echo "== $name: pagedkv-llama $*" >> "$OUT/tp4.log"
  timeout 90 ./pagedkv-llama "${common[@]}" "$@" >> "$OUT/tp4.log" 2> "/tmp/$name.err"; echo "rc=$?" >> "$OUT/tp4.log"
  tail -3 "/tmp/$name.err" >> "$OUT/tp4.log"
}
one 13b_tp4 --model-shape llama2-13b --tensor-parallel-size 4
one 13b_tp4_eager --model-shape llama2-13b --tensor-parallel-size 4 --enforce-eager
one 13b_tp1 --model-shape llama2-13b
one 8b_tp4 --model-shape llama3-8b --tensor-parallel-size 4
grep -E "^==|output tokens/s|decode step|step / roofline|tensor parallel|rc=|error|what" "$OUT/tp4.log"
