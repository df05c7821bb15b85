#!/usr/bin/env python3
"""FlashInfer's paged batch decode, the second peer of bench_decode.

Same shapes and accounting as bench_decode's `decode_shape` group and sdpa_peer.py (bf16,
head_dim 128, block (page) 16, one query token per sequence, 32/32 and 32/8 heads, KV bytes /
kernel time), on a paged cache with separate K and V pools in NHD layout and a shuffled page
table, like ours. Each shape is captured as a CUDA graph of at least 8 back-to-back runs over
disjoint copies of the KV (so that small shapes miss L2), timed with CUDA events, median of the
replays. FlashInfer's CUDA-core decode and its tensor-core decode (use_tensor_cores=True, meant
for GQA) are both timed; the faster one is FlashInfer's number. Writes JSON to argv[1]."""
import math
import sys

import torch

import flashinfer
from cuda_graph_timing import run_shapes, timed_graph

PAGE = 16


def paged_pools(batch, kv_len, hkv, d, dtype, sets):
    """`sets` disjoint copies of a paged KV cache of `batch` sequences of `kv_len` tokens: K and V
    pools of pages (NHD), each copy `pages` pages long, and FlashInfer's page table over one copy,
    shuffled (seed 42) like ours. Returns (k_pool, v_pool, pages, indices, indptr, last_page_len)."""
    pages_per_seq = -(-kv_len // PAGE)
    pages = batch * pages_per_seq
    k_pool = torch.randn(sets * pages, PAGE, hkv, d, device="cuda", dtype=dtype)
    v_pool = torch.randn(sets * pages, PAGE, hkv, d, device="cuda", dtype=dtype)
    g = torch.Generator(device="cpu").manual_seed(42)
    indices = torch.randperm(pages, generator=g).to(torch.int32).cuda()
    indptr = torch.arange(0, pages + 1, pages_per_seq, dtype=torch.int32, device="cuda")
    last = torch.full((batch,), kv_len - (pages_per_seq - 1) * PAGE, dtype=torch.int32, device="cuda")
    return k_pool, v_pool, pages, indices, indptr, last


def bench(batch, ctx, hq, hkv, d=128, dtype=torch.bfloat16):
    kv_bytes = batch * ctx * hkv * d * 2 * 2
    if kv_bytes > 9e9:
        return None
    sets = int(min(64, max(1, math.ceil(512e6 / kv_bytes))))
    k_pool, v_pool, pages, indices, indptr, last = paged_pools(batch, ctx, hkv, d, dtype, sets)
    q = torch.randn(batch, hq, d, device="cuda", dtype=dtype)
    out = torch.empty_like(q)
    reps = sets * max(1, -(-8 // sets))
    result = {"batch": batch, "ctx": ctx, "hq": hq, "hkv": hkv, "hd": d}
    best = None
    for tensor_cores in (False, True):
        workspace = torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device="cuda")
        wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            workspace, "NHD", use_cuda_graph=True, use_tensor_cores=tensor_cores,
            paged_kv_indptr_buffer=indptr.clone(), paged_kv_indices_buffer=indices.clone(),
            paged_kv_last_page_len_buffer=last.clone())
        wrapper.plan(indptr, indices, last, hq, hkv, d, PAGE, q_data_type=dtype, kv_data_type=dtype)

        def run_one(i):
            s = i % sets
            wrapper.run(q, (k_pool[s * pages:(s + 1) * pages], v_pool[s * pages:(s + 1) * pages]), out=out)

        try:
            sec, _ = timed_graph(run_one, reps)
        except Exception as e:  # a variant that does not run here is reported, not fatal
            result["tc" if tensor_cores else "cuda_core"] = f"error: {type(e).__name__}: {str(e)[:200]}"
            continue
        key = "tc" if tensor_cores else "cuda_core"
        result[key + "_us"] = sec * 1e6
        if best is None or sec < best:
            best = sec
        del wrapper, workspace
    del k_pool, v_pool
    torch.cuda.empty_cache()
    if best is None:
        return result
    result.update(us=best * 1e6, GBps=kv_bytes / best / 1e9)
    return result


def main():
    run_shapes(bench,
               lambda r: f"{r.get('us', float('nan')):.1f} us (CUDA cores {r.get('cuda_core_us', r.get('cuda_core'))}, "
                         f"tensor cores {r.get('tc_us', r.get('tc'))})",
               sys.argv[1], {"flashinfer": flashinfer.__version__, "torch": torch.__version__})


if __name__ == "__main__":
    main()
