#!/usr/bin/env bash
# FlashInfer's paged prefill (fa2, fa3) beside bench_prefill's main rows, in one device call.
# From the repository root of the device copy, carrying build/fi-peer and a folder of bench_prefill
# (+ libbenchmark) at build/dev-gpu/bin (run_prefill_device.sh build makes one). build/fi-peer holds
# site.tar.xz, FlashInfer and the runtime packages the device image lacks, made here with
#   pip download --no-deps -d wheels --python-version 3.12 --only-binary=:all: \
#     --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
#     flashinfer-python==0.7.2.post1 apache-tvm-ffi cuda-tile nvidia-cudnn-frontend nccl4py cuda-python
#   mkdir site && for w in wheels/*.whl; do python3 -m zipfile -e "$w" site/; done
#   tar cf - site | xz -6 -T2 > build/fi-peer/site.tar.xz      # 29 MB: the wheel alone is over the carry limit
# Writes the warm-up logs, bench_prefill.json/.log and flashinfer-prefill.json/.log to $OUT.
set -u
root=$PWD
mkdir -p /tmp/fi && tar xJf build/fi-peer/site.tar.xz -C /tmp/fi
export PYTHONPATH=/tmp/fi/site PYTHONUNBUFFERED=1 MAX_JOBS=16
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u
cd "$root/bench/kernels"
for b in fa2 fa3; do
  { timeout 330 python3 flashinfer_prefill_peer.py --warm --backends $b; echo "warm $b rc=$?"; } > /tmp/warm_$b.log 2>&1 &
done
wait
tail -n 4 /tmp/warm_fa2.log /tmp/warm_fa3.log; cp /tmp/warm_*.log "$OUT/"; date -u
cd "$root/build/dev-gpu/bin" && LD_LIBRARY_PATH=$PWD timeout 120 ./bench_prefill \
  --benchmark_filter='gemm_ceiling|prefill/.*/bs:16/identity:0/variant:0' \
  --benchmark_out="$OUT/bench_prefill.json" --benchmark_out_format=json > "$OUT/bench_prefill.log" 2>&1
echo "bench_prefill rc=$?"; date -u
cd "$root/bench/kernels" && timeout 150 python3 flashinfer_prefill_peer.py "$OUT/flashinfer-prefill.json" \
  > "$OUT/flashinfer-prefill.log" 2>&1
echo "flashinfer rc=$?"; tail -n 12 "$OUT/flashinfer-prefill.log"; date -u
