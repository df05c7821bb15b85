#!/usr/bin/env bash
# The GPU engine's device run, in one call: the CUDA backend's tests against the CPU backend,
# compute-sanitizer memcheck over a short engine run (its plans through the backend), and the
# end-to-end benchmark of pagedkv-llama --device cuda against Hugging Face transformers'
# continuous batching on the same requests. Run from a folder holding pagedkv-llama,
# test_cuda_backend, hf_peer.py, blas.tar.xz (the CPU backend's OpenBLAS and its runtime, which
# the device lacks; httplib.tar.xz likewise for cpp-httplib and brotli, when pagedkv-llama links
# them), test_llama_engine when present (the engine's invariance tests on the GPU) and the tests'
# golden folder; PAGEDKV_SMOLLM2 set to SmolLM2-135M's GGUF adds SmolLM2 against transformers'
# goldens. Writes what comes back under $OUT.
#   [HF_SHAPES="llama2-7b"] run_device.sh test | bench | all   [shapes...]
set -u
cd "$(dirname "$0")"
mkdir -p lib && tar xJf blas.tar.xz -C lib
[[ -f httplib.tar.xz ]] && tar xJf httplib.tar.xz -C lib
export LD_LIBRARY_PATH=$PWD/lib:$PWD
export PYTHONUNBUFFERED=1
out=${OUT:-/tmp/pagedkv-out}
logs=/tmp/pagedkv-logs
mkdir -p "$out" "$logs"
mode=${1:-all}
shift || true
shapes=("${@:-llama2-7b}")
gpu=$(nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw,memory.total --format=csv; date -u)
echo "$gpu" | tee "$out/engine.log"
if [[ $mode == all || $mode == test ]]; then
  { timeout 400 ./test_cuda_backend; echo "test_cuda_backend rc=$?"
    if [[ -x ./test_llama_engine ]]; then timeout 300 ./test_llama_engine --gtest_filter='*cuda*'; echo "test_llama_engine rc=$?"; fi
  } > "$logs/backend.log" 2>&1 &
  { timeout 500 compute-sanitizer --tool memcheck --error-exitcode 99 ./test_cuda_backend \
      --gtest_filter='CudaBackend.DecodeKernelShapes*:CudaBackend.SwapPreemption*:CudaBackend.DecodeGraphs*' 2>&1 | tail -6
    echo "memcheck rc=${PIPESTATUS[0]}"; } > "$logs/memcheck.log" 2>&1 &
  wait
  cat "$logs/backend.log" "$logs/memcheck.log" >> "$out/engine.log"
  grep -E "rc=|PASSED|FAILED|Failure|steps|SKIPPED|ERROR SUMMARY|error" "$out/engine.log" | head -40
fi
if [[ $mode == all || $mode == bench ]]; then
  # The issue's workload: 256 requests at t=0, ShareGPT-like log-normal lengths (means 161 prompt,
  # 338 output), each capped at 1024, EOS ignored, random prompt ids.
  common=(--device cuda --bench --bench-requests 256 --bench-length-scale 1 --bench-max-prompt 1024
          --max-tokens 1024 --max-batch-tokens 2048 --max-num-seqs 256 --seed 1)
  # On the 7B shape also: eager steps (no CUDA graphs), fp8 KV, and both KV dtypes in one 8 GiB
  # budget that bf16 fills (fp8 fits twice the tokens: issue 20's fp8 target).
  for shape in "${shapes[@]}"; do
    variants=("--kv-cache-dtype bf16")
    [[ $shape == llama2-7b ]] && variants+=("--kv-cache-dtype bf16 --enforce-eager" "--kv-cache-dtype fp8"
                                            "--kv-cache-dtype bf16 --kv-cache-memory 8GiB"
                                            "--kv-cache-dtype fp8 --kv-cache-memory 8GiB")
    for i in "${!variants[@]}"; do
      echo "== pagedkv-llama $shape ${variants[$i]}" >> "$out/engine.log"
      # shellcheck disable=SC2086  # each variant is a list of flags
      timeout 300 ./pagedkv-llama "${common[@]}" --model-shape "$shape" ${variants[$i]} \
        --bench-workload-out "$logs/workload_$shape.json" >> "$out/engine.log" 2>"$logs/bench_${shape}_$i.err"
      echo "rc=$?" >> "$out/engine.log"
      tail -3 "$logs/bench_${shape}_$i.err" >> "$out/engine.log"
    done
  done
  # The peer on the same requests (HF_SHAPES: which shapes; it takes minutes a shape).
  for shape in ${HF_SHAPES-${shapes[@]}}; do
    echo "== transformers $shape" >> "$out/engine.log"
    timeout "${HF_TIMEOUT:-300}" python3 hf_peer.py --shape "$shape" --workload "$logs/workload_$shape.json" \
      --out "$out/hf_$shape.json" >> "$out/engine.log" 2>"$logs/hf_$shape.err"
    echo "rc=$?" >> "$out/engine.log"
    tail -5 "$logs/hf_$shape.err" >> "$out/engine.log"
  done
  grep -vE "^\[" "$out/engine.log" | tail -60
fi
