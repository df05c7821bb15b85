#!/usr/bin/env bash
# TTFT and TPOT against the arrival rate, with prefix caching on and off, for a workload whose
# prompts share a system prompt: one `pagedkv-llama serve` a setting, bench_serve.py at each rate,
# then a Markdown table of the JSON reports (docs/benchmarks.md, "Serving").
#   bench/serve/sweep.sh PAGEDKV_LLAMA MODEL OUT_DIR [rates...]     (default rates: 0.5 1 2)
# Environment: REQUESTS (16), SHARED_PREFIX (64), PORT (8100), BENCH_ARGS (more bench_serve.py options).
set -euo pipefail
llama=${1:?usage: sweep.sh PAGEDKV_LLAMA MODEL OUT_DIR [rates...]}
model=${2:?model}
out=${3:?out dir}
shift 3
rates=("$@")
[[ ${#rates[@]} -eq 0 ]] && rates=(0.5 1 2)
here=$(cd "$(dirname "$0")" && pwd)
port=${PORT:-8100}
mkdir -p "$out"
for caching in on off; do
  flags=()
  [[ $caching == off ]] && flags=(--no-prefix-caching)
  "$llama" serve --model "$model" --port "$port" --kv-cache-tokens 16384 "${flags[@]}" 2>"$out/server-$caching.log" &
  server=$!
  for _ in $(seq 100); do
    grep -q "listening on" "$out/server-$caching.log" && break
    sleep 0.2
  done
  for rate in "${rates[@]}"; do
    python3 "$here/bench_serve.py" --port "$port" --rate "$rate" --num-requests "${REQUESTS:-16}" \
      --shared-prefix "${SHARED_PREFIX:-64}" ${BENCH_ARGS:-} --json "$out/caching-$caching-rate-$rate.json" \
      >"$out/caching-$caching-rate-$rate.txt"
    curl -s "http://127.0.0.1:$port/metrics" | grep -E '^pagedkv_prefix_cache_hit_rate ' |
      sed "s/^/caching $caching rate $rate: /" >>"$out/hit-rates.txt"
  done
  kill -TERM "$server"
  wait "$server"
done
python3 - "$out" <<'PY'
import glob, json, os, sys
out = sys.argv[1]
print("| prefix caching | rate (req/s) | completed | req/s | output tok/s | TTFT p50 / p99 (ms) | TPOT p50 / p99 (ms) | goodput (req/s) |")
print("| --- | --- | --- | --- | --- | --- | --- | --- |")
for path in sorted(glob.glob(os.path.join(out, "caching-*-rate-*.json")), key=lambda p: (p.split("-")[-3], float(p.rsplit("-", 1)[1][:-5]))):
    r = json.load(open(path))
    caching = os.path.basename(path).split("-")[1]
    print(f"| {caching} | {r['rate']:g} | {r['completed']}/{r['num_requests']} | {r['request_throughput']:.3f} | "
          f"{r['output_tokens_per_s']:.1f} | {r['ttft_ms']['p50']:.0f} / {r['ttft_ms']['p99']:.0f} | "
          f"{r['tpot_ms']['p50']:.0f} / {r['tpot_ms']['p99']:.0f} | {r['goodput']:.3f} |")
PY
cat "$out/hit-rates.txt"
