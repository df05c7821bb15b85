#!/usr/bin/env python3
"""bench_serve.py's JSON reports of one server at several rates, as a Markdown table and its knee.

    summarize.py REPORT.json ...

The knee is the highest offered rate at which at least 90% of the completed requests met the SLO
(goodput >= 0.9 x request throughput): past it, queueing pushes TTFT or TPOT over their limits.
Throughput is completed requests over the run's wall time (arrivals and the drain of the last
ones), so it stays under the offered rate even below saturation; the peak output tokens/s is the
saturated engine's."""
import json
import sys


def main():
    reports = sorted((json.load(open(path)) for path in sys.argv[1:]), key=lambda r: float(r["rate"]))
    if not reports:
        sys.exit(__doc__)
    print("| rate (req/s) | completed | req/s | output tok/s | TTFT p50 / p99 (ms) | TPOT p50 / p99 (ms) | "
          "goodput (req/s) | SLO met |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    knee = None
    for r in reports:
        met = r["goodput"] / r["request_throughput"] if r["request_throughput"] > 0 else 0.0
        if met >= 0.9 and r["failed"] == 0:
            knee = r["rate"]
        ttft, tpot = r["ttft_ms"], r["tpot_ms"]
        print(f"| {float(r['rate']):g} | {r['completed']}/{r['num_requests']} | {r['request_throughput']:.2f} | "
              f"{r['output_tokens_per_s']:.0f} | {ttft['p50'] or 0:.0f} / {ttft['p99'] or 0:.0f} | "
              f"{tpot['p50'] or 0:.1f} / {tpot['p99'] or 0:.1f} | {r['goodput']:.2f} | {100 * met:.0f}% |")
    slo = f"TTFT <= {reports[0]['slo_ttft_ms']:g} ms, TPOT <= {reports[0]['slo_tpot_ms']:g} ms"
    peak = max(reports, key=lambda r: r["output_tokens_per_s"])
    print(f"\nknee: {'none (no rate met the SLO for 90% of its requests)' if knee is None else f'{float(knee):g} req/s'} "
          f"({slo}); peak output {peak['output_tokens_per_s']:.0f} tok/s at {float(peak['rate']):g} req/s")


if __name__ == "__main__":
    main()
