#!/usr/bin/env python3
"""PyTorch scaled_dot_product_attention on contiguous KV, the peer of bench_decode.

Same shapes as bench_decode's `decode_shape` group (bf16, head_dim 128, one query token per
sequence, Llama-2-7B 32/32 and Llama-3-8B 32/8 heads), same accounting (KV bytes / kernel time),
CUDA-event timing, median of the timed runs, inputs rotated so that small shapes miss L2.
Writes JSON to argv[1]."""
import json
import math
import sys

import torch
import torch.nn.functional as F


def bench(batch, ctx, hq, hkv, d=128, dtype=torch.bfloat16):
    kv_bytes = batch * ctx * hkv * d * 2 * 2
    if kv_bytes > 9e9:
        return None
    sets = int(min(64, max(1, math.ceil(512e6 / kv_bytes))))
    qs, ks, vs = [], [], []
    for _ in range(sets):
        qs.append(torch.randn(batch, hq, 1, d, device="cuda", dtype=dtype))
        ks.append(torch.randn(batch, hkv, ctx, d, device="cuda", dtype=dtype))
        vs.append(torch.randn(batch, hkv, ctx, d, device="cuda", dtype=dtype))
    gqa = hq != hkv
    reps = sets * max(1, -(-8 // sets))  # a CUDA graph of `reps` launches, like bench_decode
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i in range(max(3, sets)):
            F.scaled_dot_product_attention(qs[i % sets], ks[i % sets], vs[i % sets], enable_gqa=gqa)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = [F.scaled_dot_product_attention(qs[i % sets], ks[i % sets], vs[i % sets], enable_gqa=gqa)
                for i in range(reps)]
    graph.replay()
    torch.cuda.synchronize()
    times = []
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    total = 0.0
    i = 0
    while (total < 0.1 or i < 20) and i < 5000:
        start.record()
        graph.replay()
        stop.record()
        stop.synchronize()
        ms = start.elapsed_time(stop) / reps
        times.append(ms)
        total += ms * reps * 1e-3
        i += 1
    times.sort()
    med = times[len(times) // 2] * 1e-3
    del qs, ks, vs, outs, graph
    torch.cuda.empty_cache()
    return {"batch": batch, "ctx": ctx, "hq": hq, "hkv": hkv, "hd": d, "us": med * 1e6,
            "GBps": kv_bytes / med / 1e9, "iterations": i}


def main():
    out = []
    for hkv in (32, 8):
        for batch in (1, 16, 64, 256):
            for ctx in (128, 512, 2048, 8192, 32768):
                r = bench(batch, ctx, 32, hkv)
                if r:
                    print(f"sdpa batch={batch} ctx={ctx} hkv={hkv}: {r['us']:.1f} us {r['GBps']:.0f} GB/s", flush=True)
                    out.append(r)
    with open(sys.argv[1], "w") as f:
        json.dump({"torch": torch.__version__, "device": torch.cuda.get_device_name(), "results": out}, f, indent=1)


if __name__ == "__main__":
    main()
