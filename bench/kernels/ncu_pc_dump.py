#!/usr/bin/env python3
"""Per-instruction counters of an Nsight Compute report, as CSV: for each kernel of REPORT, every
metric that ncu keeps per program counter (the SourceCounters section's instruction counts and
warp-state samples: stall reasons such as smsp__pcsamp_warps_issue_stalled_no_instructions), one
row a PC with its SASS. Needs ncu's Python report interface (extras/python of Nsight Compute on
PYTHONPATH), so it runs where ncu is (run_prefill_ncu_device.sh).

  ncu_pc_dump.py REPORT.ncu-rep OUT.csv
"""
import csv
import sys

import ncu_report


def main():
    rep, out = sys.argv[1], sys.argv[2]
    ctx = ncu_report.load_report(rep)
    with open(out, "w", newline="") as f:
        w = csv.writer(f)
        for r in range(ctx.num_ranges()):
            rng = ctx.range_by_idx(r)
            for a in range(rng.num_actions()):
                act = rng.action_by_idx(a)
                per_pc = {}
                names = []
                for name in sorted(act.metric_names()):
                    m = act.metric_by_name(name)
                    if m is None or not m.has_correlation_ids() or m.num_instances() == 0:
                        continue
                    ids = m.correlation_ids()
                    names.append(name)
                    for i in range(m.num_instances()):
                        per_pc.setdefault(ids.as_uint64(i), {})[name] = m.as_double(i)
                w.writerow(["kernel", "pc", "sass"] + names)
                for pc in sorted(per_pc):
                    try:
                        sass = act.sass_by_pc(pc)
                    except Exception:  # an older report interface without sass_by_pc
                        sass = ""
                    w.writerow([act.name(), hex(pc), sass] + [per_pc[pc].get(n, "") for n in names])
                print(f"{act.name()}: {len(per_pc)} PCs, {len(names)} per-PC metrics", flush=True)


if __name__ == "__main__":
    main()
