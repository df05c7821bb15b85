#!/usr/bin/env bash
# Helper div's device call (session 6, docs/journal/prefill-kernel.md, run dv-1): the wgmma body
# whose Q load and epilogue split packed rows by the plan's fast divisor and steps (no run-time
# division a row) against main's before it, as two bench_prefill binaries. From the repository
# root, carrying build/<dir> (this script, run_prefill_ws_device.sh, prefill_variant_summary.py
# and dv.tar.xz: dv/ with test_prefill_plan, test_prefill_cuda, test_attention_step_cuda,
# bench_prefill (new), bench_prefill_old (main's) and libbenchmark.so.1debian) and build/fi-peer.
# FlashInfer's JIT warm-up starts first, beside the prefill tests with memcheck and racecheck;
# then the shipped rows (variant 0) of both binaries three times each, interleaved old, new, new,
# old, old, new; then SDPA and FlashInfer fa2/fa3 on the same shapes. Logs to $OUT.
# Usage: bash <dir>/run_prefill_div_device.sh <dir>
set -u; export OUT
root=$PWD; d=$(cd "${1:?the carried folder}" && pwd) || exit 1
(cd "$d" && tar xJf dv.tar.xz) || exit 1
bin=$d/dv; cp "$d"/run_prefill_ws_device.sh "$d"/prefill_variant_summary.py "$bin"/
mkdir -p /tmp/fi && tar xJf "$root/build/fi-peer/site.tar.xz" -C /tmp/fi
( cd "$root/bench/kernels" && for b in fa2 fa3; do
    { PYTHONPATH=/tmp/fi/site MAX_JOBS=16 timeout 300 python3 flashinfer_prefill_peer.py --warm --backends $b; echo "warm $b rc=$?"; } > /tmp/warm_$b.log 2>&1 &
  done; wait ) &
warm=$!
BENCH_FILTER='gemm_ceiling' BENCH_TIMEOUT=30 bash "$bin/run_prefill_ws_device.sh" "$bin" || { wait $warm; exit 1; }
echo "tests done after ${SECONDS}s"
k=0
for which in old new new old old new; do
  k=$((k + 1)); exe=./bench_prefill; [[ $which == old ]] && exe=./bench_prefill_old
  ( cd "$bin" && LD_LIBRARY_PATH=$bin timeout 60 $exe --benchmark_filter='prefill/.*variant:0/' \
      --benchmark_out="$OUT/bench-$k-$which.json" --benchmark_out_format=json --benchmark_counters_tabular=true \
      > "$OUT/bench-$k-$which.log" 2>&1; echo "bench $k $which rc=$? after ${SECONDS}s" )
done
# One JSON for the summary: the new binary's rows as variant 9 beside the old binary's variant 0.
python3 - "$OUT" <<'PY'
import glob, json, os, sys
out = sys.argv[1]; merged = None
for f in sorted(glob.glob(os.path.join(out, "bench-*.json"))):
    j = json.load(open(f))
    for b in j["benchmarks"]:
        if f.endswith("-new.json"): b["name"] = b["name"].replace("variant:0/", "variant:9/")
    if merged is None: merged = j
    else: merged["benchmarks"] += j["benchmarks"]
gemm = json.load(open(os.path.join(out, "bench_prefill.json")))["benchmarks"]
merged["benchmarks"] = [b for b in gemm if b["name"].startswith("gemm_ceiling")] + merged["benchmarks"]
json.dump(merged, open(os.path.join(out, "bench_prefill_merged.json"), "w"), indent=1)
PY
( cd "$root/bench/kernels" && LD_LIBRARY_PATH= timeout 70 python3 prefill_peer.py "$OUT/prefill-peer.json" > /tmp/peer.log 2>&1
  echo "prefill_peer rc=$? after ${SECONDS}s"; tail -2 /tmp/peer.log )
wait $warm; tail -n 1 /tmp/warm_fa2.log /tmp/warm_fa3.log; echo "warm-up done after ${SECONDS}s"
( cd "$root/bench/kernels" && PYTHONPATH=/tmp/fi/site timeout 60 python3 flashinfer_prefill_peer.py "$OUT/flashinfer-prefill.json" \
    > /tmp/fi.log 2>&1; echo "flashinfer rc=$? after ${SECONDS}s"; tail -3 /tmp/fi.log )
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv; date -u
python3 "$bin/prefill_variant_summary.py" 9 "$OUT/bench_prefill_merged.json" "$OUT/prefill-peer.json" \
  "$OUT/flashinfer-prefill.json" | tee "$OUT/summary.md"
