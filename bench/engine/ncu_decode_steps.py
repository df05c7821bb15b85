#!/usr/bin/env python3
"""Summarises an ncu CSV of pagedkv-llama --profile-steps decode steps (gpu__time_duration.sum):
per step (split at the embedding kernel), each kind of kernel's time and launches, and each
product's achieved bandwidth and rate from its shape.

usage: ncu_decode_steps.py CSV MODEL_SHAPE READ_GBPS
The products of a layer come in the forward's order: QKV, O, gate/up, down (cuBLASLt's split-K
reductions, if any, are counted with the product before them); the last step product is the LM head.
"""
import csv
import sys

SHAPES = {  # dim, q_dim, kv_dim, ffn, vocab, layers
    "llama2-7b": (4096, 4096, 4096, 11008, 32000, 32),
    "llama3-8b": (4096, 4096, 1024, 14336, 128256, 32),
}


def is_product(name):
    return name.startswith(("nvjet", "sm90_xmma", "cutlass", "void cutlass", "gemm", "void gemmk")) or "gemm" in name.lower()


def main():
    path, shape, read_gbps = sys.argv[1], sys.argv[2], float(sys.argv[3])
    dim, q_dim, kv_dim, ffn, vocab, layers = SHAPES[shape]
    rows = [r for r in csv.reader(l for l in open(path) if l.startswith('"'))]
    header, rows = rows[0], rows[1:]
    col = {h: i for i, h in enumerate(header)}
    kernels = []
    for r in rows:
        if r[col["Metric Name"]] != "gpu__time_duration.sum":
            continue
        kernels.append((r[col["Kernel Name"]], r[col["Grid Size"]], float(r[col["Metric Value"]].replace(",", "")) / 1e3))
    steps, cur = [], None
    for k in kernels:
        if "embed_kernel" in k[0]:
            cur = []
            steps.append(cur)
        if cur is not None:
            cur.append(k)
    products = [("QKV", dim, q_dim + 2 * kv_dim), ("O", q_dim, dim), ("gate/up", dim, 2 * ffn), ("down", ffn, dim)]
    for s, ks in enumerate(steps):
        n = int(ks[0][1].strip("()").split(",")[0])  # embed grid: the (padded) batch
        total = sum(t for _, _, t in ks)
        print(f"step {s}: batch {n} (padded), {len(ks)} kernels, {total:.1f} us")
        by = {}
        for name, _, t in ks:
            short = name.split("(")[0][:70]
            a = by.setdefault(short, [0.0, 0])
            a[0] += t
            a[1] += 1
        for name, (t, c) in sorted(by.items(), key=lambda x: -x[1][0]):
            print(f"  {t:9.1f} us {c:4d}  {name}")
        # products in order: 4 a layer, then the LM head
        prod_times = {p[0]: [0.0, 0, set()] for p in products}
        prod_times["LM head"] = [0.0, 0, set()]
        layer_prod = []
        i = 0
        seq = []
        for name, grid, t in ks:
            if is_product(name):
                seq.append([name, grid, t])
            elif seq and ("splitK" in name or "reduce" in name.lower()):
                seq[-1][2] += t
        for j, (name, grid, t) in enumerate(seq):
            label = "LM head" if j == len(seq) - 1 and len(seq) % 4 == 1 else products[j % 4][0]
            a = prod_times[label]
            a[0] += t
            a[1] += 1
            a[2].add(name.split("(")[0][:60] + " " + grid)
        print("  product   ms    GB/s  %read  TFLOP/s  kernels")
        tot_t = tot_b = tot_f = 0.0
        for label, k_in, k_out in products + [("LM head", dim, vocab)]:
            t, c, names = prod_times[label]
            if c == 0:
                continue
            per = c if label != "LM head" else 1
            wbytes = 2.0 * k_in * k_out * per
            abytes = 2.0 * n * (k_in + k_out) * per * (2 if label == "LM head" else 1)
            flops = 2.0 * n * k_in * k_out * per
            gbps = (wbytes + abytes) / (t * 1e3)
            tot_t += t
            tot_b += wbytes + abytes
            tot_f += flops
            print(f"  {label:8s} {t/1e3:5.2f} {gbps:7.0f} {100*gbps/read_gbps:5.1f}% {flops/t/1e6:7.0f}  {sorted(names)}")
        print(f"  products {tot_t/1e3:5.2f} ms: {tot_b/1e9:.2f} GB ({tot_b/read_gbps/1e6:.2f} ms at the read ceiling), "
              f"{tot_f/1e12:.2f} TFLOP")


if __name__ == "__main__":
    main()
