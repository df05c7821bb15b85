#!/usr/bin/env bash
# Issue 20's prefill steps: RoPE and the K/V write in one launch of 16-byte pieces for steps of
# more than dependent_launch_max_tokens tokens (rope_write_kv_rows) against the build before
# (rope in place, then write_kv), in one device call: the engine's GPU tests and
# compute-sanitizer memcheck over the cases that run the new kernel (stops if they fail), a
# kernel-time profile (ncu) of one 2048-token step (--profile-steps 0 of a 16-request run) of
# llama2-7b with the new build (with `both`: of both shapes with both builds), then issue 20's
# workload on both shapes with the new pagedkv-llama and the one before (base/pagedkv-llama),
# alternating (new first; with `reverse`, the build before first), and with `peer` transformers'
# continuous batching (../../bench/engine/hf_peer.py) on llama2-7b's requests in the time left of
# 290 s (not with `both`: 9 files would not come back). Run q2 was `run_prefill_rope_device.sh
# peer`. Run from a folder laid out as run_peer_device.sh's, with the build before in base/.
# Writes at most 8 files under $OUT.
set -u
source "$(dirname "$0")/../../bench/engine/carried_env.sh"
nvidia-smi --query-gpu=name,driver_version --format=csv; date -u
engine_tests_and_memcheck '*OneToken*:*DecodeKernelShapes*:*Fp8*' 'one token, fp8' || { echo "tests failed: stopping"; exit 1; }
common=(--device cuda --bench --bench-length-scale 1 --bench-max-prompt 1024 --max-batch-tokens 2048
        --max-num-seqs 256 --seed 1)
profile() {  # binary, shape, name
  timeout 60 ncu --profile-from-start off --clock-control none --cache-control none --metrics gpu__time_duration.sum \
    --csv --print-units base "$1" "${common[@]}" --bench-requests 16 --max-tokens 2 --model-shape "$2" \
    --profile-steps 0 > "$out/ncu_$3.csv" 2> /tmp/ncu.err
  echo "== ncu $3 rc=$? $(wc -l < "$out/ncu_$3.csv") lines"; tail -1 /tmp/ncu.err
  grep -E "rope|write_kv" "$out/ncu_$3.csv" | head -4 | awk -F'","' '{print substr($5, 1, 60), $9, $NF}'
}
both=$([[ " $* " == *" both "* ]] && echo 1)
peer=$([[ " $* " == *" peer "* ]] && echo 1)
[[ $both && $peer ]] && { echo "both and peer together write 9 files under \$OUT: give one"; exit 2; }
profile ./pagedkv-llama llama2-7b step0
if [[ $both ]]; then
  profile base/pagedkv-llama llama2-7b step0_llama2-7b_base
  profile ./pagedkv-llama llama3-8b step0_llama3-8b
  profile base/pagedkv-llama llama3-8b step0_llama3-8b_base
fi
run() {  # binary, shape, name, more flags
  timeout 60 "$1" "${common[@]}" --bench-requests 256 --max-tokens 1024 --model-shape "$2" "${@:4}" > "/tmp/$3.log" 2> "/tmp/$3.err"
  echo "== $3 rc=$?" | tee -a "$out/bench.log"; cat "/tmp/$3.log" >> "$out/bench.log"
  grep -E "output tokens/s|step / roofline|prefill steps|TTFT" "/tmp/$3.log"
}
if [[ " $* " == *" reverse "* ]]; then
  run base/pagedkv-llama llama2-7b llama2-7b_base --bench-workload-out /tmp/workload_llama2-7b.json
  run ./pagedkv-llama llama2-7b llama2-7b_new
  run ./pagedkv-llama llama3-8b llama3-8b_new
  run base/pagedkv-llama llama3-8b llama3-8b_base
else
  run ./pagedkv-llama llama2-7b llama2-7b_new --bench-workload-out /tmp/workload_llama2-7b.json
  run base/pagedkv-llama llama2-7b llama2-7b_base
  run base/pagedkv-llama llama3-8b llama3-8b_base
  run ./pagedkv-llama llama3-8b llama3-8b_new
fi
if [[ $peer ]]; then
  export PYTHONUNBUFFERED=1
  timeout $((290 - SECONDS)) python3 ../../bench/engine/hf_peer.py --shape llama2-7b --workload /tmp/workload_llama2-7b.json \
    --out "$out/hf_llama2-7b.json" > "$out/hf_llama2-7b.log" 2>&1
  echo "== transformers llama2-7b rc=$? after ${SECONDS} s"; tail -2 "$out/hf_llama2-7b.log"
fi
date -u
