#!/usr/bin/env bash
# Nsight Compute on 16 prompts of 1k (bf16, head_dim 128, block size 16, shuffled pages), 32/32
# and 32/8 heads: the shipped wgmma body (bench_prefill's variant-0 row) and FlashInfer fa3's
# paged prefill kernel (flashinfer_prefill_ncu.py) under the same ncu options (--set full, the
# card's clocks as found, caches flushed), plus run dg-2's peeled variant 6 (bench_prefill of
# commit 21335f3, wip/gpu-narrow) for the instruction-fetch question. fa3's JIT (150 s+) runs
# first without ncu, in the background while our kernels are profiled. Run ncu-1 of
# docs/journal/prefill-kernel.md: from the repository root, carrying build/fi-peer and DIR
# (bench_prefill, libbenchmark.so.1debian, bench_prefill_dg2, this script,
# flashinfer_prefill_ncu.py, ncu_pc_dump.py, ncu_summary.py):
#   bash DIR/run_prefill_ncu_device.sh DIR
# $OUT: run.log, details.txt (every report's details page), summary.md (ncu_summary.py),
# raw.tar.xz (raw pages, per-PC counters, SASS source pages, logs), reps.tar (the .ncu-rep files).
set -u
root=$PWD; d=$(cd "${1:-build/dev-ncu}" && pwd) || exit 1
w=/tmp/ncu; mkdir -p "$w" /tmp/fi
exec > >(tee "$OUT/run.log") 2>&1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv; ncu --version | tail -1; date -u
tar xJf build/fi-peer/site.tar.xz -C /tmp/fi || exit 1
( cd bench/kernels && PYTHONPATH=/tmp/fi/site MAX_JOBS=16 timeout 270 python3 flashinfer_prefill_peer.py --warm --backends fa3 \
    > /tmp/warm_fa3.log 2>&1; echo "warm fa3 rc=$?" >> /tmp/warm_fa3.log ) &
warm=$!
export LD_LIBRARY_PATH=$d
M=sm__cycles_active.min,sm__cycles_active.max,sm__cycles_active.avg,sm__cycles_elapsed.max,smsp__inst_executed.sum
NCU=(ncu --clock-control none --set full --metrics "$M" -f)
ours() {  # report name, binary, KV heads, variant
  timeout 100 "${NCU[@]}" -k regex:prefill_wgmma_ws --launch-skip 3 --launch-count 1 -o "$w/$1" "$d/$2" \
    --benchmark_filter="prefill/shape:2/batch:16/hkv:$3/bs:16/identity:0/variant:$4/" > "$w/$1.log" 2>&1
  echo "$1 rc=$? $(date -u +%T)"; grep -E "^prefill|==PROF==|==ERROR==|==WARNING==" "$w/$1.log" | head -4
}
ours ours_32 bench_prefill 32 0
ours ours_8 bench_prefill 8 0
ours v6_32 bench_prefill_dg2 32 6
ours v6_8 bench_prefill_dg2 8 6
wait $warm; tail -n 2 /tmp/warm_fa3.log; date -u
fa3() {  # KV heads
  (cd bench/kernels && PYTHONPATH=$root/bench/kernels:/tmp/fi/site timeout 100 "${NCU[@]}" -k "$2" --launch-skip 2 \
    --launch-count 1 -o "$w/fa3_$1" python3 "$d/flashinfer_prefill_ncu.py" --hkv "$1" > "$w/fa3_$1.log" 2>&1)
  echo "fa3_$1 rc=$? $(date -u +%T)"; grep -E "^flashinfer|==PROF==|==ERROR==|==WARNING==" "$w/fa3_$1.log" | head -4
}
fa3 32 regex:PrefillWithKVCacheKernel
[[ -f $w/fa3_32.ncu-rep ]] || fa3 32 regex:Prefill
fa3 8 regex:PrefillWithKVCacheKernel
[[ -f $w/fa3_8.ncu-rep ]] || fa3 8 regex:Prefill
cp /tmp/warm_fa3.log "$w/"
export PYTHONPATH=$(dirname "$(find /opt/nvidia /usr/local/cuda*/ -name ncu_report.py 2>/dev/null | head -1)")
for r in ours_32 ours_8 fa3_32 fa3_8 v6_32 v6_8; do
  [[ -f $w/$r.ncu-rep ]] || continue
  { echo "#### $r"; ncu --import "$w/$r.ncu-rep" --page details --print-details all 2>&1; } >> "$OUT/details.txt"
  ncu --import "$w/$r.ncu-rep" --page raw --csv > "$w/$r.raw.csv" 2>&1
  ncu --import "$w/$r.ncu-rep" --page source --csv --print-source sass > "$w/$r.source.csv" 2>&1
  timeout 60 python3 "$d/ncu_pc_dump.py" "$w/$r.ncu-rep" "$w/$r.pcs.csv" 2>&1 | tail -2
done
python3 "$d/ncu_summary.py" $(ls "$w"/{ours_32,fa3_32,ours_8,fa3_8,v6_32,v6_8}.raw.csv 2>/dev/null) > "$OUT/summary.md"
(cd "$w" && tar cJf "$OUT/raw.tar.xz" *.csv *.log && tar cf "$OUT/reps.tar" *.ncu-rep); ls -la "$OUT"; date -u
cat "$OUT/summary.md"
