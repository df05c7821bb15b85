#!/usr/bin/env python3
"""A load generator for `pagedkv-llama serve` (or any OpenAI-compatible server): vLLM's serving
benchmark's shape, with the standard library only.

    bench_serve.py --port 8000 --rate 1 --num-requests 32 [--shared-prefix 64] [--json out.json]

Draws the ShareGPT-like workload of `pagedkv-llama --bench` (bench_workload.hpp: log-normal prompt
and output lengths, median 101 and 230 tokens, scaled by --length-scale and clamped; uniform random
prompt token ids, optionally behind a shared prefix, sent as token arrays; EOS ignored so each
request generates its drawn length), sends each as a streamed /v1/completions request at Poisson
arrivals of --rate requests/s (inf: all at once), and reports what vLLM's benchmark_serving does:

- request throughput, output and total tokens/s over the run's wall time;
- TTFT (arrival to first text), TPOT ((latency - TTFT) / (output tokens - 1)), ITL (between
  successive text events) and end-to-end latency: mean, p50, p99 (against a server without a
  tokenizer, `serve --model-shape`, whose chunks carry no text: a chunk that is not a choice's end);
- goodput: completed requests/s meeting both --slo-ttft-ms and --slo-tpot-ms.

A request that fails (HTTP error, broken stream) counts as failed, not in the figures.
"""
import argparse
import asyncio
import json
import math
import random
import statistics
import sys
import time

SHAREGPT_PROMPT = (4.6147, 1.0)  # ln(tokens) ~ N(mu, sigma^2): docs/simulation.md's fit
SHAREGPT_OUTPUT = (5.4417, 0.9)


def draw_length(rng, mu_sigma, scale, limit):
    mu, sigma = mu_sigma
    return int(min(max(round(scale * math.exp(rng.gauss(mu, sigma))), 1), limit))


def make_workload(args):
    rng = random.Random(args.seed)
    prefix_rng = random.Random(args.seed ^ 0x9E3779B97F4A7C15)
    prefix = [prefix_rng.randrange(args.vocab_size) for _ in range(args.shared_prefix)]
    max_prompt = min(args.max_prompt_tokens, args.context_tokens - 1)
    if args.shared_prefix >= max_prompt:
        sys.exit(f"--shared-prefix {args.shared_prefix} leaves no room in prompts of at most {max_prompt} tokens")
    requests = []
    for _ in range(args.num_requests):
        own = draw_length(rng, SHAREGPT_PROMPT, args.length_scale, max_prompt - args.shared_prefix)
        token_rng = random.Random(rng.getrandbits(64))
        prompt = prefix + [token_rng.randrange(args.vocab_size) for _ in range(own)]
        room = min(args.max_output_tokens, args.context_tokens - len(prompt))
        requests.append((prompt, draw_length(rng, SHAREGPT_OUTPUT, args.length_scale, room)))
    return requests


async def send(host, port, model, prompt, max_tokens, timeout):
    """One streamed completion; returns its timings, or the reason it failed."""
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    if model:
        body["model"] = model
    data = json.dumps(body).encode()
    start = time.perf_counter()
    out = {"prompt_tokens": len(prompt), "output_tokens": 0, "ttft": None, "itl": [], "error": None}
    writer = None
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
        writer.write(f"POST /v1/completions HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode() + data)
        await writer.drain()
        status = await asyncio.wait_for(reader.readline(), timeout)
        if b" 200 " not in status:
            rest = await asyncio.wait_for(reader.read(), timeout)
            out["error"] = f"{status.decode().strip()} {rest[-200:].decode(errors='replace')}"
            return out
        headers = {}
        while (line := await asyncio.wait_for(reader.readline(), timeout)) not in (b"\r\n", b"\n", b""):
            name, _, value = line.decode().partition(":")
            headers[name.strip().lower()] = value.strip().lower()
        chunked = headers.get("transfer-encoding") == "chunked"
        last = None
        done = False
        buffer = b""
        while not done:
            if chunked:  # HTTP/1.1 chunks, whatever the events' boundaries
                size = int((await asyncio.wait_for(reader.readline(), timeout)).split(b";")[0], 16)
                data = await asyncio.wait_for(reader.readexactly(size + 2), timeout) if size else b""
                buffer += data[:size]
            else:
                data = await asyncio.wait_for(reader.read(65536), timeout)
                buffer += data
            if not data:
                break
            while b"\n\n" in buffer:  # one server-sent event: its data: line(s) and a blank line
                event_text, buffer = buffer.split(b"\n\n", 1)
                payload = b"".join(l[len(b"data: "):] for l in event_text.split(b"\n") if l.startswith(b"data: ")).strip()
                if payload == b"[DONE]":
                    done = True
                    break
                if not payload:
                    continue
                event = json.loads(payload)
                if event.get("error"):
                    raise ValueError(f"error event: {event['error']}")
                if event.get("usage"):
                    out["output_tokens"] = event["usage"]["completion_tokens"]
                # A token arrived: new text, or (a server without a tokenizer) a chunk with none
                # that is not the choice's end.
                choice = event["choices"][0] if event.get("choices") else None
                if choice is not None and (choice.get("text") or choice.get("finish_reason") is None):
                    now = time.perf_counter()
                    if out["ttft"] is None:
                        out["ttft"] = now - start
                    else:
                        out["itl"].append(now - last)
                    last = now
        if not done:
            out["error"] = "the stream ended before [DONE]"
        out["latency"] = time.perf_counter() - start
    except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, ValueError) as e:
        out["error"] = f"{type(e).__name__}: {e}"
    finally:
        if writer is not None:
            writer.close()
    return out


def percentiles(values):
    if not values:
        return {"mean": None, "p50": None, "p99": None}
    ordered = sorted(values)

    def pct(p):  # numpy's default (linear) interpolation, as vLLM's benchmark reports
        k = (len(ordered) - 1) * p / 100
        lo, hi = math.floor(k), math.ceil(k)
        return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)
    return {"mean": statistics.fmean(ordered), "p50": pct(50), "p99": pct(99)}


async def run(args):
    workload = make_workload(args)
    rng = random.Random(args.seed + 1)
    tasks = []
    start = time.perf_counter()
    for prompt, output_tokens in workload:
        tasks.append(asyncio.create_task(send(args.host, args.port, args.model, prompt, output_tokens, args.timeout)))
        if args.rate != math.inf:
            await asyncio.sleep(rng.expovariate(args.rate))
    results = await asyncio.gather(*tasks)
    duration = time.perf_counter() - start
    ok = [r for r in results if r["error"] is None]
    failed = [r for r in results if r["error"] is not None]
    ms = 1000.0
    tpots = [(r["latency"] - r["ttft"]) / (r["output_tokens"] - 1) for r in ok if r["output_tokens"] > 1 and r["ttft"]]
    good = [r for r in ok if r["ttft"] is not None and r["ttft"] * ms <= args.slo_ttft_ms and
            (r["output_tokens"] <= 1 or (r["latency"] - r["ttft"]) / (r["output_tokens"] - 1) * ms <= args.slo_tpot_ms)]
    output_tokens = sum(r["output_tokens"] for r in ok)
    report = {
        "rate": args.rate, "num_requests": len(results), "completed": len(ok), "failed": len(failed),
        "duration_s": duration,
        "request_throughput": len(ok) / duration,
        "output_tokens_per_s": output_tokens / duration,
        "total_tokens_per_s": (output_tokens + sum(r["prompt_tokens"] for r in ok)) / duration,
        "goodput": len(good) / duration, "slo_ttft_ms": args.slo_ttft_ms, "slo_tpot_ms": args.slo_tpot_ms,
        "ttft_ms": {k: v and v * ms for k, v in percentiles([r["ttft"] for r in ok if r["ttft"] is not None]).items()},
        "tpot_ms": {k: v and v * ms for k, v in percentiles(tpots).items()},
        "itl_ms": {k: v and v * ms for k, v in percentiles([x for r in ok for x in r["itl"]]).items()},
        "e2e_latency_ms": {k: v and v * ms for k, v in percentiles([r["latency"] for r in ok]).items()},
        "errors": sorted({r["error"] for r in failed})[:5],
    }
    return report


def print_report(rep):
    print(f"requests           {rep['completed']} completed, {rep['failed']} failed, at {rep['rate']} requests/s, "
          f"{rep['duration_s']:.2f} s")
    print(f"request throughput {rep['request_throughput']:.3f} requests/s")
    print(f"output tokens/s    {rep['output_tokens_per_s']:.2f}")
    print(f"total tokens/s     {rep['total_tokens_per_s']:.2f}")
    print(f"goodput            {rep['goodput']:.3f} requests/s (TTFT <= {rep['slo_ttft_ms']:g} ms, "
          f"TPOT <= {rep['slo_tpot_ms']:g} ms)")
    for name in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_latency_ms"):
        v = rep[name]
        if v["mean"] is None:
            print(f"{name:<18} -")
        else:
            print(f"{name:<18} mean {v['mean']:.1f}  p50 {v['p50']:.1f}  p99 {v['p99']:.1f}")
    for e in rep["errors"]:
        print(f"error              {e}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--model", default=None, help="the model field (default: none, the server's one model)")
    p.add_argument("--rate", type=float, default=math.inf, help="Poisson arrivals a second (default inf: all at t=0)")
    p.add_argument("--num-requests", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--length-scale", type=float, default=0.25, help="multiplies the drawn lengths, as --bench's")
    p.add_argument("--shared-prefix", type=int, default=0, help="tokens every prompt starts with (a system prompt)")
    p.add_argument("--max-prompt-tokens", type=int, default=256)
    p.add_argument("--max-output-tokens", type=int, default=64)
    p.add_argument("--context-tokens", type=int, default=2048)
    p.add_argument("--vocab-size", type=int, default=49152, help="prompt ids are uniform below this (SmolLM2's)")
    p.add_argument("--slo-ttft-ms", type=float, default=2000.0)
    p.add_argument("--slo-tpot-ms", type=float, default=500.0)
    p.add_argument("--timeout", type=float, default=600.0, help="seconds a request may wait for its next bytes")
    p.add_argument("--json", default=None, help="also write the report here")
    args = p.parse_args()
    if not args.rate > 0 or args.num_requests < 1 or not args.length_scale > 0:
        sys.exit("--rate and --length-scale must be positive, --num-requests at least 1")
    report = asyncio.run(run(args))
    print_report(report)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    sys.exit(1 if report["failed"] else 0)


if __name__ == "__main__":
    main()
