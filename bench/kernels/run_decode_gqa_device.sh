#!/usr/bin/env bash
# GQA decode at the engine's shapes (issue 20, docs/journal/decode-kernel.md "NHD, HND and paired
# CTAs at the engine's shapes"), in one call: bench_decode's read ceiling, its decode_engine rows
# (the library's plan over NHD and HND pools, paired CTAs over NHD ones; uniform and engine-spread
# lengths, 32/8 and 32/32) and decode_pair rows (paired CTAs against the library's plan on the
# decode table's shapes), then ncu on the uniform 200 x 250 rows (DRAM throughput, sectors a
# cp.async request, L2 hit rate, the SMs' active cycles min/avg/max for the tail). Run from a folder
# holding bench_decode, libbenchmark.so.1debian and this script; writes under $OUT: bench_decode.json,
# bench.log, ncu.txt, res.txt (the bodies' registers).
set -u
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=$PWD
out=${OUT:-/tmp/pagedkv-out}
mkdir -p "$out"
gpu=$(nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv; date -u)
echo "$gpu"
timeout 150 ./bench_decode --benchmark_filter="${BENCH_FILTER:-read_ceiling|decode_engine/.*plan:(0|7)/|decode_pair/}" \
  --benchmark_out="$out/bench_decode.json" --benchmark_out_format=json --benchmark_counters_tabular=true > "$out/bench.log" 2>&1
echo "bench_decode rc=$? $(date -u +%T)"
m=gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum,lts__t_sector_hit_rate.pct
m=$m,l1tex__t_sectors_pipe_lsu_mem_global_op_ldgsts.sum,l1tex__t_requests_pipe_lsu_mem_global_op_ldgsts.sum
m=$m,sm__cycles_active.min,sm__cycles_active.avg,sm__cycles_active.max,sm__cycles_elapsed.max,sm__warps_active.avg.pct_of_peak_sustained_active
for row in hkv:8/fp8:0/table:2/hnd:0/max_splits:0/lengths:0/plan:0/ hkv:8/fp8:0/table:2/hnd:1/max_splits:0/lengths:0/plan:0/ \
           hkv:8/fp8:0/table:2/hnd:0/max_splits:0/lengths:0/plan:7/ hkv:32/fp8:0/table:2/hnd:0/max_splits:0/lengths:0/plan:0/; do
  echo "== ncu decode_engine/batch:200/ctx:250/bs:16/hd:128/hq:32/$row" >> "$out/ncu.txt"
  timeout 40 ncu --clock-control none --cache-control none --metrics "$m" -k regex:decode_mma_kernel --launch-skip 4 \
    --launch-count 1 ./bench_decode --benchmark_filter="decode_engine/batch:200/ctx:250/bs:16/hd:128/hq:32/$row" \
    >> "$out/ncu.txt" 2>&1
  echo "rc=$?" >> "$out/ncu.txt"
done
echo "ncu done $(date -u +%T)"
cuobjdump --dump-resource-usage ./bench_decode 2>/dev/null | grep -A1 decode_mma_kernel | cut -c1-200 > "$out/res.txt"
grep -oE "REG:[0-9]+ STACK:[0-9]+ SHARED:[0-9]+ LOCAL:[0-9]+" "$out/res.txt" | sort | uniq -c
grep -E "^== |rc=|gpu__time|dram__|lts__|l1tex__|sm__" "$out/ncu.txt" | sed -E 's/ +/ /g'
# The short table last: name, us, % of the read ceiling, splits, CTA shape (0 narrow, 1 wide, 2 shallow, 3 paired).
python3 - "$out/bench_decode.json" <<'PY'
import json, sys
for b in json.load(open(sys.argv[1]))["benchmarks"]:
    n = b["name"].replace("/bs:16/hd:128/hq:32", "").replace("/fp8:0", "").replace("/max_splits:0", "").replace("/min_time:0.100/manual_time", "")
    print(f'{n:70s} {b.get("us", b.get("real_time", 0)):8.1f} {b.get("pct_ceiling", 0):6.1f} {int(b.get("splits", 0)):3d} {int(b.get("cta", -1)):2d}')
PY
