#!/usr/bin/env python3
"""Routing a multi-turn trace over several engines by the prefix cache's hash chain (docs/scale-out.md,
"Routing by the hash spec"), against routers that do not look at the prompt.

A model, not the shipped engine: each engine's prefix cache is an LRU set of full-block keys
(docs/hashing.md's chain, tools/block_hash.py) of a fixed capacity, a request's hit is the longest
run of its chain's keys from the first that the engine holds, and after the request the engine holds
every full block of its prompt and output. Requests run one at a time in arrival order, so no block
is held by a running sequence. A router that follows the engines' KV events knows each cache
exactly; here it reads the model's sets.

Token ids: a prefix group's prefix_len tokens are the same wherever the group appears; a session's
turn is its history (previous prompt + previous output) + new tokens; a branch starts from its
parent's history (docs/simulation.md, "Sessions"). Every other token is a fresh id.

    route_sim.py TRACE.jsonl [--engines 4] [--blocks 1024] [--block-size 16]

Prints, for each router, the prompt tokens served from a prefix cache and the largest engine's
share of the requests against an even split. Needs the xxhash package (python3-xxhash).
"""
import argparse
import collections
import json
import os
import sys
import zlib

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
from block_hash import block_hashes  # noqa: E402  (tools/ is not a package)


def requests_of(path):
    """The trace's records as token lists: (session or None, prompt tokens, output tokens)."""
    history, out, fresh = {}, [], iter(range(1 << 20, 1 << 31))
    with open(path, encoding="utf-8") as f:
        records = [json.loads(line) for line in f if line.strip()]
    for r in sorted(records, key=lambda r: r["arrival_step"]):  # stable: the trace's order among equals
        session, new = r.get("session"), r["prompt_len"]
        if session is not None and session in history:  # a later turn: its history + the new tokens
            start = history[session]
        elif r.get("branch_of") is not None:  # a branch: its parent's history + the new tokens
            start = history[r["branch_of"]]
        elif r.get("prefix_group") is not None:  # a shared system prompt, part of prompt_len
            seed = zlib.crc32(r["prefix_group"].encode("utf-8"))
            start = [(seed + i) % (1 << 20) for i in range(r["prefix_len"])]
            new -= r["prefix_len"]
        else:
            start = []
        prompt = start + [next(fresh) for _ in range(new)]
        output = [next(fresh) for _ in range(r["output_len"])]
        if session is not None:
            history[session] = prompt + output
        out.append((session, prompt, output))
    return out


class engine:
    def __init__(self, capacity):
        self.capacity, self.keys, self.requests = capacity, collections.OrderedDict(), 0

    def hit_blocks(self, chain):
        n = 0
        while n < len(chain) and chain[n] in self.keys:
            n += 1
        return n

    def serve(self, chain, all_blocks):
        hit = self.hit_blocks(chain)
        for key in all_blocks:  # every block touched, most recent last
            self.keys.pop(key, None)
            self.keys[key] = True
        while len(self.keys) > self.capacity:
            self.keys.popitem(last=False)
        self.requests += 1
        return hit


def simulate(requests, router, engines, blocks, block_size):
    pool = [engine(blocks) for _ in range(engines)]
    hit_tokens = prompt_tokens = 0
    for i, (session, prompt, output) in enumerate(requests):
        chain = block_hashes(prompt, block_size)
        all_blocks = block_hashes(prompt + output[:-1], block_size)  # the last token gets no slot
        e = router(i, session, chain, pool)
        hit_tokens += pool[e].serve(chain, all_blocks) * block_size
        prompt_tokens += len(prompt)
    busiest = max(p.requests for p in pool) / (len(requests) / engines)
    return hit_tokens / prompt_tokens, busiest


def round_robin(i, session, chain, pool):
    return i % len(pool)


def by_session(i, session, chain, pool):
    """Sticky sessions: what a router without the hash spec can do when requests carry an id."""
    return zlib.crc32((session or str(i)).encode("utf-8")) % len(pool)


def by_prefix(i, session, chain, pool):
    """The longest cached prefix of the request's chain; among equals, the engine with the fewest
    requests so far."""
    return max(range(len(pool)), key=lambda e: (pool[e].hit_blocks(chain), -pool[e].requests, -e))


def by_prefix_bounded(i, session, chain, pool, slack=1.25):
    """by_prefix among the engines whose requests so far are within `slack` of the mean (bounded
    loads, as consistent hashing with bounded loads keeps them): a prefix that every request
    shares would otherwise send every request to one engine."""
    bound = slack * (sum(p.requests for p in pool) + 1) / len(pool)
    allowed = [e for e in range(len(pool)) if pool[e].requests + 1 <= bound] or range(len(pool))
    return max(allowed, key=lambda e: (pool[e].hit_blocks(chain), -pool[e].requests, -e))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("trace")
    p.add_argument("--engines", type=int, default=4)
    p.add_argument("--blocks", type=int, default=1024, help="each engine's prefix cache, in blocks")
    p.add_argument("--block-size", type=int, default=16)
    a = p.parse_args()
    requests = requests_of(a.trace)
    print(f"{a.trace}: {len(requests)} requests, {a.engines} engines of {a.blocks} blocks of {a.block_size} tokens")
    routers = (("round robin", round_robin), ("by session", by_session), ("by prefix hash", by_prefix),
               ("prefix, bounded", by_prefix_bounded))
    for name, router in routers:
        hit, busiest = simulate(requests, router, a.engines, a.blocks, a.block_size)
        print(f"  {name:15s} prompt tokens from a prefix cache {100 * hit:5.1f}%, busiest engine {busiest:.2f}x an even share")


if __name__ == "__main__":
    main()
