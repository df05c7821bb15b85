#!/usr/bin/env python3
"""PyTorch scaled_dot_product_attention on contiguous KV, the peer of bench_decode.

Same shapes as bench_decode's `decode_shape` group (bf16, head_dim 128, one query token per
sequence, Llama-2-7B 32/32 and Llama-3-8B 32/8 heads), same accounting (KV bytes / kernel time),
CUDA-event timing, median of the timed runs, inputs rotated so that small shapes miss L2.
Writes JSON to argv[1]."""
import math
import sys

import torch
import torch.nn.functional as F

from cuda_graph_timing import run_shapes, timed_graph


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

    def run_one(i):
        return F.scaled_dot_product_attention(qs[i % sets], ks[i % sets], vs[i % sets], enable_gqa=gqa)

    med, replays = timed_graph(run_one, reps, warmups=max(3, sets))
    del qs, ks, vs
    torch.cuda.empty_cache()
    return {"batch": batch, "ctx": ctx, "hq": hq, "hkv": hkv, "hd": d, "us": med * 1e6,
            "GBps": kv_bytes / med / 1e9, "iterations": replays}


def main():
    run_shapes(bench, lambda r: f"{r['us']:.1f} us {r['GBps']:.0f} GB/s", sys.argv[1], {"torch": torch.__version__})


if __name__ == "__main__":
    main()
