#!/usr/bin/env bash
# `pagedkv-llama serve --device cuda` under load, in one device call: random llama2-7b weights
# (--model-shape; no tokenizer, so prompts go as token ids), driven by bench_serve.py (the Python
# standard library only: the device has no network) at Poisson rates up to saturation, then
# summarize.py's table and knee. Run from a folder holding a CUDA build's pagedkv-llama,
# blas.tar.xz and httplib.tar.xz (bench/engine/run_device.sh says what they hold), placed at
# build/<name> of a checkout (it runs ../../bench/serve/*.py); writes under $OUT.
#   [SHAPE=llama2-7b] [RATES="1 2 4 8 12 16 24"] build/<name>/run_device.sh
set -u
cd "$(dirname "$0")"
mkdir -p lib && tar xJf blas.tar.xz -C lib && tar xJf httplib.tar.xz -C lib
export LD_LIBRARY_PATH=$PWD/lib:$PWD PYTHONUNBUFFERED=1
out=${OUT:-/tmp/out}
mkdir -p "$out"
bench=../../bench/serve
shape=${SHAPE:-llama2-7b}
port=8000
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$out/summary.txt"
date -u | tee -a "$out/summary.txt"
# The engine's device-bench settings (docs/benchmarks.md): 2048-token steps, up to 256 sequences,
# the KV cache from --gpu-memory-utilization 0.9; a queue that never refuses this load.
./pagedkv-llama serve --device cuda --model-shape "$shape" --port $port --seed 1 --max-num-seqs 256 \
  --max-batch-tokens 2048 --max-queued-requests 2048 2> "$out/server.log" &
server=$!
for _ in $(seq 600); do
  grep -q "listening on" "$out/server.log" && break
  kill -0 $server 2>/dev/null || break
  sleep 0.5
done
grep "listening on" "$out/server.log" | tee -a "$out/summary.txt" || { tail "$out/server.log"; exit 1; }
# The --bench workload at full length (ShareGPT-like log-normal lengths, means 161 prompt and 338
# output tokens, each capped at 1024; EOS ignored), 8 s of arrivals a rate (at least 32 requests).
# SLO: TTFT <= 1 s, TPOT <= 50 ms.
for rate in ${RATES:-1 2 4 8 12 16 24}; do
  n=$(python3 -c "print(max(32, round(8 * $rate)))")
  timeout 150 python3 $bench/bench_serve.py --port $port --rate "$rate" --num-requests "$n" --seed 1 \
    --length-scale 1 --max-prompt-tokens 1024 --max-output-tokens 1024 --context-tokens 4096 --vocab-size 32000 \
    --slo-ttft-ms 1000 --slo-tpot-ms 50 --timeout 120 --json "$out/rate-$rate.json" > "$out/rate-$rate.txt" 2>&1
  echo "== rate $rate: rc=$?"; grep -E "^requests|^output|^ttft|^tpot|^goodput" "$out/rate-$rate.txt"
done
python3 -c "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:$port/metrics').read().decode())" \
  > "$out/metrics.txt" 2>&1
kill -TERM $server
wait $server
echo "server rc=$?"; tail -2 "$out/server.log"
python3 $bench/summarize.py "$out"/rate-*.json | tee -a "$out/summary.txt"
date -u
