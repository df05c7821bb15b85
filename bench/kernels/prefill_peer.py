#!/usr/bin/env python3
"""PyTorch scaled_dot_product_attention on contiguous K/V, the peer of bench_prefill.

Same shapes and accounting as bench_prefill's main rows (bf16, head_dim 128, 32 query heads over
32 or 8 KV heads; one 4k prompt, one 16k prompt, 16 prompts of 1k, a 512-token chunk over 8k cached
tokens at batch 1 and 8; causal FLOPs counted exactly: 4 * head_dim * query heads * keys attended),
with the flash and the cuDNN backends forced in turn (sdpa_kernel). A chunk's causal mask is
bottom-right aligned (its queries are the last 512 of 8704 positions): torch's
causal_lower_right bias, which PyTorch runs on its flash kernel; the cuDNN backend is timed only
where q_len == kv_len (plain is_causal). GQA through enable_gqa (no copies of K/V). CUDA-graph
timing as the decode peers (cuda_graph_timing.py), inputs rotated over enough sets to miss L2.
Writes JSON to argv[1]."""
import math
import sys
import json

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right

from cuda_graph_timing import timed_graph

SHAPES = [  # (name, batch, q_len, kv_len)
    ("prompt_4k", 1, 4096, 4096),
    ("prompt_16k", 1, 16384, 16384),
    ("prompts_16x1k", 16, 1024, 1024),
    ("chunk_512_over_8k", 1, 512, 8192 + 512),
    ("chunk_512_over_8k", 8, 512, 8192 + 512),
]


def causal_flops(kv_len, q_len, hq, d):
    first = kv_len - q_len + 1
    keys = (first + kv_len) * q_len // 2
    return 4.0 * keys * hq * d


def bench(name, batch, q_len, kv_len, hq, hkv, backend, expand=False, d=128, dtype=torch.bfloat16):
    kv_bytes = batch * kv_len * hkv * d * 2 * 2
    sets = int(min(16, max(1, math.ceil(256e6 / kv_bytes))))
    qs = [torch.randn(batch, hq, q_len, d, device="cuda", dtype=dtype) for _ in range(sets)]
    ks = [torch.randn(batch, hkv, kv_len, d, device="cuda", dtype=dtype) for _ in range(sets)]
    vs = [torch.randn(batch, hkv, kv_len, d, device="cuda", dtype=dtype) for _ in range(sets)]
    if expand:  # K/V heads copied to every query head (outside the timing)
        ks = [k.repeat_interleave(hq // hkv, dim=1) for k in ks]
        vs = [v.repeat_interleave(hq // hkv, dim=1) for v in vs]
        hkv = hq
    square = q_len == kv_len
    mask = None if square else causal_lower_right(q_len, kv_len)
    gqa = hq != hkv

    def run_one(i):
        with sdpa_kernel([backend]):
            if square:
                return F.scaled_dot_product_attention(qs[i % sets], ks[i % sets], vs[i % sets], is_causal=True,
                                                      enable_gqa=gqa)
            return F.scaled_dot_product_attention(qs[i % sets], ks[i % sets], vs[i % sets], attn_mask=mask,
                                                  enable_gqa=gqa)

    reps = max(sets, 4)
    sec, replays = timed_graph(run_one, reps, warmups=max(3, sets))
    del qs, ks, vs
    torch.cuda.empty_cache()
    flops = causal_flops(kv_len, q_len, hq, d) * batch
    return {"us": sec * 1e6, "TFLOPs": flops / sec / 1e12, "iterations": replays, "expanded_kv": expand}


def main():
    out = []
    for hkv in (32, 8):
        for name, batch, q_len, kv_len in SHAPES:
            row = {"shape": name, "batch": batch, "q_len": q_len, "kv_len": kv_len, "hq": 32, "hkv": hkv, "hd": 128}
            for label, backend in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
                if label == "cudnn" and q_len != kv_len:
                    row[label] = "n/a: PyTorch runs a bottom-right causal mask on its flash kernel"
                    continue
                for expand in ((False, True) if hkv != 32 else (False,)):
                    try:  # enable_gqa first; where the backend refuses it, K/V expanded to every head
                        row[label] = bench(name, batch, q_len, kv_len, 32, hkv, backend, expand)
                        break
                    except Exception as e:  # a backend that does not take a shape is reported, not fatal
                        row[label] = f"error: {type(e).__name__}: {str(e)[:200]}"
            print(json.dumps(row), flush=True)
            out.append(row)
    with open(sys.argv[1], "w") as f:
        json.dump({"torch": torch.__version__, "device": torch.cuda.get_device_name(), "results": out}, f, indent=1)


if __name__ == "__main__":
    main()
