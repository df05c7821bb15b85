#!/usr/bin/env python3
"""The peers of bench_cache_ops' `merge_states` rows: PyTorch eager (the formula in five ops) and
FlashInfer's merge_state / merge_states where it imports. Same shapes (bf16, head_dim 128, 32
heads a token, 2 and 8 states), same accounting (bytes read + written / time), the same CUDA-graph
timing as the decode peers, inputs rotated so that small shapes miss L2. Writes JSON to argv[1]."""
import json
import math
import sys

import torch

from cuda_graph_timing import timed_graph

try:
    import flashinfer
except ImportError:  # not on the device image unless its wheel was carried
    flashinfer = None

HEADS, D = 32, 128


def torch_merge(o, lse):
    """o [states, rows, D] bf16, lse [states, rows] fp32 (natural log) -> merged o, lse."""
    m = lse.max(dim=0).values
    w = torch.exp(lse - m)
    total = w.sum(dim=0)
    out = (w.unsqueeze(-1) * o.float()).sum(dim=0) / total.unsqueeze(-1)
    return out.to(o.dtype), m + torch.log(total)


def bench(rows, states):
    bytes_moved = (states + 1) * rows * D * 2 + (states + 1) * rows * 4
    sets = int(min(64, max(1, math.ceil(512e6 / bytes_moved))))
    reps = sets * max(1, -(-8 // sets))
    seq = rows // HEADS
    result = {"rows": rows, "states": states, "MB": bytes_moved / 1e6}
    o = [torch.randn(states, rows, D, device="cuda", dtype=torch.bfloat16) for _ in range(sets)]
    lse = [torch.randn(states, rows, device="cuda", dtype=torch.float32) * 5 for _ in range(sets)]
    t, _ = timed_graph(lambda i: torch_merge(o[i % sets], lse[i % sets]), reps, warmups=max(3, sets))
    result["torch_us"] = t * 1e6
    if flashinfer is not None:
        if states == 2:
            va = [x[0].view(seq, HEADS, D) for x in o]
            vb = [x[1].view(seq, HEADS, D) for x in o]
            sa = [x[0].view(seq, HEADS) for x in lse]
            sb = [x[1].view(seq, HEADS) for x in lse]
            run = lambda i: flashinfer.merge_state(va[i % sets], sa[i % sets], vb[i % sets], sb[i % sets])
        else:  # its layout: [seq, states, heads, D]
            v = [torch.randn(seq, states, HEADS, D, device="cuda", dtype=torch.bfloat16) for _ in range(sets)]
            s = [torch.randn(seq, states, HEADS, device="cuda", dtype=torch.float32) for _ in range(sets)]
            run = lambda i: flashinfer.merge_states(v[i % sets], s[i % sets])
        t, _ = timed_graph(run, reps, warmups=max(3, sets))
        result["flashinfer_us"] = t * 1e6
    return result


def main():
    out = []
    for states in (2, 8):
        for rows in (32, 2048, 8192, 65536, 262144):
            r = bench(rows, states)
            print(r, flush=True)
            out.append(r)
    with open(sys.argv[1], "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                   "flashinfer": getattr(flashinfer, "__version__", None), "results": out}, f, indent=1)


if __name__ == "__main__":
    main()
