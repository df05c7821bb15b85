#!/usr/bin/env python3
"""Where a kernel's warp-state samples fall, from Nsight Compute's SASS source page
(`ncu --import R --page source --csv --print-source sass > R.source.csv`): samples by stall
reason, split by how often each instruction ran (its `Instructions Executed`, warp-level: code run
once a CTA or item against the tile loop's), and by opcode for the chosen reasons (run ncu-1 of
docs/journal/prefill-kernel.md, session 6).

  ncu_source_breakdown.py R.source.csv [--reasons stall_wait,stall_no_inst] [--top 12]
"""
import argparse
import collections
import csv


def load(path):
    rows = list(csv.reader(open(path, newline="")))
    header = rows[1]
    out = []
    for r in rows[2:]:
        if len(r) != len(header):
            continue
        d = dict(zip(header, r))
        for k in header[2:]:
            try:
                d[k] = float(d[k])
            except ValueError:
                pass
        out.append(d)
    return rows[0][1] if len(rows[0]) > 1 else "", header, out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("source")
    ap.add_argument("--reasons", default="stall_wait,stall_no_inst,stall_long_sb,stall_barrier")
    ap.add_argument("--top", type=int, default=12)
    args = ap.parse_args()
    kernel, header, ins = load(args.source)
    reasons = [h for h in header if h.startswith("stall_") and "(Not Issued)" not in h]
    total = sum(i["# Samples"] for i in ins)
    print(f"{args.source}: {len(ins)} instructions, {total:.0f} samples, "
          f"{sum(i['Instructions Executed'] for i in ins):.0f} warp instructions executed")
    # Classes by execution count: every distinct count holding 3% or more of the samples.
    by_count = collections.defaultdict(lambda: collections.Counter())
    for i in ins:
        c = by_count[int(i["Instructions Executed"])]
        c["instructions"] += 1
        c["samples"] += i["# Samples"]
        for r in reasons:
            c[r] += i[r]
    print("\nexecuted (warp) | instructions | samples | % | " + " | ".join(r[6:] for r in reasons))
    rest = collections.Counter()
    for n, c in sorted(by_count.items(), key=lambda kv: -kv[1]["samples"]):
        if c["samples"] < 0.03 * total:
            rest.update(c)
            continue
        print(f"{n} | {c['instructions']} | {c['samples']:.0f} | {100 * c['samples'] / total:.1f} | "
              + " | ".join(f"{c[r]:.0f}" for r in reasons))
    print(f"other counts | {rest['instructions']} | {rest['samples']:.0f} | {100 * rest['samples'] / total:.1f} | "
          + " | ".join(f"{rest[r]:.0f}" for r in reasons))
    for reason in args.reasons.split(","):
        ops = collections.Counter()
        for i in ins:
            ops[i["Source"].split()[0] if i["Source"].split() else "?"] += i[reason]
        s = sum(ops.values())
        print(f"\n{reason}: {s:.0f} samples; by opcode: "
              + ", ".join(f"{op} {v:.0f}" for op, v in ops.most_common(args.top)))
        top = sorted(ins, key=lambda i: -i[reason])[: args.top]
        for i in top:
            print(f"  {i['Address'][-5:]} x{int(i['Instructions Executed'])} {i[reason]:.0f}: {i['Source'].strip()[:70]}")


if __name__ == "__main__":
    main()
