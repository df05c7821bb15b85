#!/usr/bin/env python3
"""FlashInfer's paged batch prefill on one shape, launched plainly (no CUDA graph), for Nsight
Compute: the shape and pages of flashinfer_prefill_peer.py (bf16, head_dim 128, 32 query heads,
causal, NHD pages of 16 over a shuffled table), one KV copy, `--runs` back-to-back runs. Under
`ncu -k regex:PrefillWithKVCache --launch-skip 2 --launch-count 1` the third run is profiled
(run_prefill_ncu_device.sh). Compile the backend's kernels first without ncu
(flashinfer_prefill_peer.py --warm --backends fa3).

  flashinfer_prefill_ncu.py --hkv 8 [--backend fa3] [--batch 16 --q-len 1024 --kv-len 1024]
"""
import argparse

import torch

import flashinfer
from flashinfer_peer import PAGE, paged_pools


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hkv", type=int, default=32)
    ap.add_argument("--backend", default="fa3")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--q-len", type=int, default=1024)
    ap.add_argument("--kv-len", type=int, default=1024)
    ap.add_argument("--runs", type=int, default=4)
    args = ap.parse_args()
    hq, d, dtype = 32, 128, torch.bfloat16
    k_pool, v_pool, _, indices, kv_indptr, last = paged_pools(args.batch, args.kv_len, args.hkv, d, dtype, 1)
    qo_indptr = torch.arange(0, args.batch * args.q_len + 1, args.q_len, dtype=torch.int32, device="cuda")
    q = torch.randn(args.batch * args.q_len, hq, d, device="cuda", dtype=dtype)
    out = torch.empty_like(q)
    workspace = torch.empty(512 * 1024 * 1024, dtype=torch.uint8, device="cuda")
    wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD", backend=args.backend)
    wrapper.plan(qo_indptr, kv_indptr, indices, last, hq, args.hkv, d, PAGE, causal=True, q_data_type=dtype,
                 kv_data_type=dtype)
    for _ in range(args.runs):
        wrapper.run(q, (k_pool, v_pool), out=out)
    torch.cuda.synchronize()
    print(f"flashinfer {flashinfer.__version__} {args.backend}: {args.batch} x {args.q_len} over {args.kv_len}, "
          f"32/{args.hkv}, {args.runs} runs, out finite: {bool(torch.isfinite(out).all())}", flush=True)


if __name__ == "__main__":
    main()
