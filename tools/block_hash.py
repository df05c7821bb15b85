#!/usr/bin/env python3
"""pagedkv's block-hash chain (docs/hashing.md) in Python, for routers that must compute the
prefix cache's keys. `block_hash.py VECTORS.json` checks every test vector; exits 1 on a mismatch.
Needs the xxhash package (Debian: python3-xxhash)."""
import json
import struct
import sys

import xxhash

DEFAULT_SEED = 0x5BD1E9955BD1E995


def root_hash(seed=DEFAULT_SEED, adapter_id=0, cache_salt=""):
    """The parent of a prompt's first block: the adapter id, then the salt, if any."""
    h = xxhash.xxh3_64_intdigest(struct.pack("<q", adapter_id), seed=seed)
    if cache_salt:
        h = xxhash.xxh3_64_intdigest(cache_salt.encode("utf-8"), seed=h)
    return h


def block_hashes(tokens, block_size, seed=DEFAULT_SEED, adapter_id=0, cache_salt=""):
    """The chained hashes of the full blocks of `tokens` (a partial last block has none)."""
    parent = root_hash(seed, adapter_id, cache_salt)
    hashes = []
    for start in range(0, len(tokens) - block_size + 1, block_size):
        block = struct.pack(f"<{block_size}i", *tokens[start:start + block_size])
        parent = xxhash.xxh3_64_intdigest(block, seed=parent)
        hashes.append(parent)
    return hashes


def main(path):
    failures = 0
    for v in json.load(open(path, encoding="utf-8"))["vectors"]:
        seed, adapter, salt = int(v["seed"], 16), v["adapter_id"], v["cache_salt"]
        got = [root_hash(seed, adapter, salt)] + block_hashes(v["tokens"], v["block_size"], seed, adapter, salt)
        if [f"{h:016x}" for h in got] != [v["root_hash"]] + v["hashes"]:
            print(f"vector {v['name']}: got {got}", file=sys.stderr)
            failures += 1
    print(f"{failures} of the vectors differ" if failures else "every vector matches")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
