#!/usr/bin/env bash
# 16 prompts of 1k against FlashInfer fa3 in turns (helper qtma's run qt-4, docs/journal/prefill-kernel.md,
# session 7): the peers move 2-3% between calls, so one call's single pair does not say whether
# 16 x 1k is past fa3. After fa3's JIT warm-up, ROUNDS rounds (default 4) of bench_prefill's
# shipped 16 x 1k rows (32/32 and 32/8) then flashinfer_prefill_peer.py (fa3; FA3_SHAPE: only
# that shape, default every shape, the order of run qt-4), then each round's ratios and their mean.
# Run qt-4 found ours 12% faster alone than after the 4k and 16k rows: compare like with like
# (qt-5: FA3_SHAPE=prompts_16x1k). From the repository root, carrying build/<dir>
# (this script and dv.tar.xz: dv/ with bench_prefill and libbenchmark.so.1debian) and
# build/fi-peer. Writes $OUT/fa3-pairs.tar.xz (every JSON and log) and $OUT/fa3-pairs.md.
# Usage: bash <dir>/run_prefill_fa3_pairs_device.sh <dir> [ROUNDS]
set -u
root=$PWD; d=$(cd "${1:?the carried folder}" && pwd) || exit 1; rounds=${2:-4}
(cd "$d" && tar xJf dv.tar.xz) || exit 1
bin=$d/dv; logs=/tmp/fa3-pairs; mkdir -p "$logs" /tmp/fi
tar xJf "$root/build/fi-peer/site.tar.xz" -C /tmp/fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv; date -u
cd "$root/bench/kernels" || exit 1
PYTHONPATH=/tmp/fi/site MAX_JOBS=16 timeout 300 python3 flashinfer_prefill_peer.py --warm --backends fa3 \
  > "$logs/warm.log" 2>&1; echo "warm-up rc=$? after ${SECONDS}s"
# The SM clock, power and temperature every 200 ms over the rounds (smi.csv).
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv -lms 200 > "$logs/smi.csv" &
smi=$!
for i in $(seq 1 "$rounds"); do
  ( cd "$bin" && LD_LIBRARY_PATH=$bin timeout 60 ./bench_prefill --benchmark_filter='prefill/shape:2/.*variant:0/' \
      --benchmark_out="$logs/ours-$i.json" --benchmark_out_format=json > "$logs/ours-$i.log" 2>&1 )
  echo "ours $i rc=$? after ${SECONDS}s ($(date -u +%T))"
  PYTHONPATH=/tmp/fi/site timeout 120 python3 flashinfer_prefill_peer.py "$logs/fa3-$i.json" --backends fa3 \
    ${FA3_SHAPE:+--shape "$FA3_SHAPE"} > "$logs/fa3-$i.log" 2>&1
  echo "fa3 $i rc=$? after ${SECONDS}s ($(date -u +%T))"
done
kill "$smi"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv; date -u
python3 - "$logs" "$rounds" <<'PY' | tee "$logs/fa3-pairs.md"
import json, os, re, statistics, sys
logs, rounds = sys.argv[1], int(sys.argv[2])
print("| heads | round | ours | fa3 | ours / fa3 |\n|---|---|---|---|---|")
for hkv in (32, 8):
    ratios = []
    for i in range(1, rounds + 1):
        try:
            ours = [b["TFLOPs"] for b in json.load(open(os.path.join(logs, f"ours-{i}.json")))["benchmarks"]
                    if b.get("run_type") == "iteration" and f"/hkv:{hkv}/" in b["name"]]
            fa3 = [r["fa3"]["TFLOPs"] for r in json.load(open(os.path.join(logs, f"fa3-{i}.json")))["results"]
                   if r["shape"] == "prompts_16x1k" and r["hkv"] == hkv]
        except (OSError, ValueError, KeyError) as e:
            print(f"| 32/{hkv} | {i} | missing: {e} | | |"); continue
        ratios.append(ours[0] / fa3[0])
        print(f"| 32/{hkv} | {i} | {ours[0]:.1f} | {fa3[0]:.1f} | {ratios[-1]:.3f} |")
    if ratios:
        print(f"| 32/{hkv} | mean | | | **{statistics.mean(ratios):.3f}** (min {min(ratios):.3f}, max {max(ratios):.3f}) |")
PY
tar cJf "$OUT/fa3-pairs.tar.xz" -C "$logs" . && cp "$logs/fa3-pairs.md" "$OUT/"
