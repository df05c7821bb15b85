"""CUDA-graph timing and the shape sweep shared by the peers of bench_decode (sdpa_peer.py,
flashinfer_peer.py)."""
import json

import torch


def timed_graph(run_one, reps, warmups=3):
    """Times run_one(i) as bench_decode times its kernels: `warmups` calls on a side stream, then
    one CUDA graph of run_one(0..reps-1) back to back (their results kept alive until the timing
    ends, so each captured call writes its own output), replayed and timed with CUDA events until
    0.1 s and 20 replays have passed (5000 at most). Returns (median seconds per call, replays)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i in range(warmups):
            run_one(i)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = [run_one(i) for i in range(reps)]
    graph.replay()
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times, total, i = [], 0.0, 0
    while (total < 0.1 or i < 20) and i < 5000:
        start.record()
        graph.replay()
        stop.record()
        stop.synchronize()
        ms = start.elapsed_time(stop) / reps
        times.append(ms)
        total += ms * reps * 1e-3
        i += 1
    del outs
    times.sort()
    return times[len(times) // 2] * 1e-3, i


def run_shapes(bench, describe, out_path, meta):
    """Runs bench(batch, ctx, 32, hkv) over bench_decode's `decode_shape` sweep (Llama-2-7B 32/32
    and Llama-3-8B 32/8 heads; batch 1..256; context 128..32k), printing describe(result) for each
    shape that fits, and writes {**meta, device, results} as JSON to out_path."""
    out = []
    for hkv in (32, 8):
        for batch in (1, 16, 64, 256):
            for ctx in (128, 512, 2048, 8192, 32768):
                r = bench(batch, ctx, 32, hkv)
                if r:
                    print(f"batch={batch} ctx={ctx} hkv={hkv}: {describe(r)}", flush=True)
                    out.append(r)
    with open(out_path, "w") as f:
        json.dump({**meta, "device": torch.cuda.get_device_name(), "results": out}, f, indent=1)
