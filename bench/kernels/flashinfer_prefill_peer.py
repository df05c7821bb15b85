#!/usr/bin/env python3
"""FlashInfer's paged batch prefill, the second peer of bench_prefill.

Same shapes and accounting as bench_prefill's main rows and prefill_peer.py (bf16, head_dim 128,
32 query heads over 32 or 8 KV heads, causal, FLOPs counted exactly), through
`BatchPrefillWithPagedKVCacheWrapper` on NHD page pools of page size 16 with a shuffled page table,
like ours; a chunk's queries are the last 512 of its sequence's positions, which is FlashInfer's
own causal alignment. Both of its backends are timed, fa2 and fa3 (`--backends`). Each shape is
planned once and captured as a CUDA graph of back-to-back runs over disjoint copies of the KV
(cuda_graph_timing.py), median of the replays.

  flashinfer_prefill_peer.py --warm --backends fa3     # JIT-compiles the kernels only (a tiny shape)
  flashinfer_prefill_peer.py OUT.json [--backends fa2,fa3] [--shape prompts_16x1k]
"""
import argparse
import json
import math

import torch

import flashinfer
from cuda_graph_timing import timed_graph
from flashinfer_peer import PAGE, paged_pools
from prefill_peer import SHAPES, causal_flops


def bench(batch, q_len, kv_len, hq, hkv, backend, d=128, dtype=torch.bfloat16):
    kv_bytes = batch * kv_len * hkv * d * 2 * 2
    sets = int(min(16, max(1, math.ceil(256e6 / kv_bytes))))
    k_pool, v_pool, pages, indices, kv_indptr, last = paged_pools(batch, kv_len, hkv, d, dtype, sets)
    qo_indptr = torch.arange(0, batch * q_len + 1, q_len, dtype=torch.int32, device="cuda")
    qs = [torch.randn(batch * q_len, hq, d, device="cuda", dtype=dtype) for _ in range(sets)]
    out = torch.empty_like(qs[0])
    workspace = torch.empty(512 * 1024 * 1024, dtype=torch.uint8, device="cuda")
    wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(
        workspace, "NHD", use_cuda_graph=True, qo_indptr_buf=qo_indptr.clone(),
        paged_kv_indptr_buf=kv_indptr.clone(), paged_kv_indices_buf=indices.clone(),
        paged_kv_last_page_len_buf=last.clone(), backend=backend)
    wrapper.plan(qo_indptr, kv_indptr, indices, last, hq, hkv, d, PAGE, causal=True, q_data_type=dtype,
                 kv_data_type=dtype)

    def run_one(i):
        s = i % sets
        wrapper.run(qs[s], (k_pool[s * pages:(s + 1) * pages], v_pool[s * pages:(s + 1) * pages]), out=out)

    sec, replays = timed_graph(run_one, max(sets, 4), warmups=max(3, sets))
    del wrapper, workspace, k_pool, v_pool, qs
    torch.cuda.empty_cache()
    flops = causal_flops(kv_len, q_len, hq, d) * batch
    return {"us": sec * 1e6, "TFLOPs": flops / sec / 1e12, "iterations": replays}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out", nargs="?")
    ap.add_argument("--backends", default="fa2,fa3")
    ap.add_argument("--warm", action="store_true", help="compile the kernels on a tiny shape, time nothing")
    ap.add_argument("--shape", help="time only the shapes of this name (default: every shape)")
    args = ap.parse_args()
    backends = args.backends.split(",")
    if args.warm:
        for backend in backends:
            for hkv in (32, 8):
                bench(1, 64, 64 + 32, 32, hkv, backend)
            print(f"{backend}: compiled", flush=True)
        return
    out = []
    for hkv in (32, 8):
        for name, batch, q_len, kv_len in SHAPES:
            if args.shape and name != args.shape:
                continue
            row = {"shape": name, "batch": batch, "q_len": q_len, "kv_len": kv_len, "hq": 32, "hkv": hkv, "hd": 128}
            for backend in backends:
                try:
                    row[backend] = bench(batch, q_len, kv_len, 32, hkv, backend)
                except Exception as e:  # a backend that does not take a shape is reported, not fatal
                    row[backend] = f"error: {type(e).__name__}: {str(e)[:200]}"
            print(json.dumps(row), flush=True)
            out.append(row)
    with open(args.out, "w") as f:
        json.dump({"flashinfer": flashinfer.__version__, "torch": torch.__version__,
                   "device": torch.cuda.get_device_name(), "results": out}, f, indent=1)


if __name__ == "__main__":
    main()
