"""Decodes the KV event batches that tests/core/kv_events_emit.cpp wrote with pagedkv's encoder,
using msgspec and classes declared as vLLM declares its events (vllm/distributed/kv_events.py in
the releases whose structs are array_like: EventBatch array_like, omit_defaults, gc=False;
KVCacheEvent also tag=True, so each event is [class name, fields...]), and compares every field
with expected.json. Exits non-zero on the first difference.

    python kv_events_msgspec.py DIR
"""
import json
import sys
from pathlib import Path
from typing import Any, Optional, Union

import msgspec

# vLLM's ExternalBlockHash: a hash as bytes or as an int (pagedkv sends uint64 ints).
ExternalBlockHash = Union[bytes, int]


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]


class KVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    """The base of vLLM's KV cache events."""


class BlockStored(KVCacheEvent):
    block_hashes: list[ExternalBlockHash]
    parent_block_hash: Optional[ExternalBlockHash]
    token_ids: list[int]
    block_size: int
    lora_id: Optional[int]
    medium: Optional[str]


class BlockRemoved(KVCacheEvent):
    block_hashes: list[ExternalBlockHash]
    medium: Optional[str]


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: list[Union[BlockStored, BlockRemoved, AllBlocksCleared]]


FIELDS = {
    "BlockStored": ["block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium"],
    "BlockRemoved": ["block_hashes", "medium"],
    "AllBlocksCleared": [],
}


def main() -> int:
    directory = Path(sys.argv[1])
    expected = json.loads((directory / "expected.json").read_text())
    decoder = msgspec.msgpack.Decoder(KVEventBatch)
    media = set()
    counts = {name: 0 for name in FIELDS}
    for batch_expected in expected:
        batch = decoder.decode((directory / batch_expected["file"]).read_bytes())
        where = batch_expected["file"]
        assert batch.ts == batch_expected["ts"], f"{where}: ts {batch.ts} != {batch_expected['ts']}"
        assert len(batch.events) == len(batch_expected["events"]), f"{where}: {len(batch.events)} events"
        for i, (event, want) in enumerate(zip(batch.events, batch_expected["events"])):
            name = type(event).__name__
            assert name == want["type"], f"{where} event {i}: {name} != {want['type']}"
            counts[name] += 1
            for field in FIELDS[name]:
                got = getattr(event, field)
                assert got == want[field], f"{where} event {i} {name}.{field}: {got!r} != {want[field]!r}"
            if name != "AllBlocksCleared":
                media.add(event.medium)
    assert media == {"GPU", "CPU"}, f"media {media}: the device and host tiers must both be seen"
    assert all(counts.values()), f"every event type must be decoded at least once: {counts}"
    print(f"every field matches: {counts} across {len(expected)} batches, media {sorted(media)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
