"""Decoding the engines' KV event payloads: what each field becomes, and what is skipped
and counted instead of failing."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvobs.fleet.wire import MalformedBatch, _decode_careful, block_key, decode_batch


def payload(*events: Any) -> bytes:
    return msgspec.msgpack.encode([2.5, list(events), None])


def stored(**fields: Any) -> dict[str, Any]:
    return {"type": "BlockStored", "block_hashes": [1, 2], "parent_block_hash": None,
            "token_ids": [], "block_size": 16, "lora_id": None, **fields}


@pytest.mark.parametrize(("medium", "tier"), [
    (None, "gpu"), ("GPU", "gpu"), ("CPU", "host"), ("CPU_PINNED", "host"),
    ("STORAGE", "disk"), ("DISK", "disk"), ("EXTERNAL", "remote")])
def test_each_engines_medium_names_a_tier(medium: str | None, tier: str) -> None:
    fields = {} if medium is None else {"medium": medium}
    batch = decode_batch(payload(stored(**fields), {"type": "BlockRemoved", "block_hashes": [3],
                                                     **fields}))
    assert batch.events == [("stored", tier, [1, 2], 16), ("removed", tier, [3], 0)]
    assert batch.ts == 2.5


def test_hashes_become_64_bit_keys() -> None:
    assert block_key(-1) == 2**64 - 1                  # SGLang's signed int64
    assert block_key(2**64 + 5) == 5
    assert block_key(bytes(range(1, 33))) == int.from_bytes(bytes(range(1, 9)), "big")
    assert block_key(7, group=0) == 7
    assert block_key(7, group=1) != block_key(7, group=2) != 7
    assert block_key(True) is None and block_key(b"") is None and block_key(1.5) is None


def test_unknown_and_malformed_events_are_counted_and_skipped() -> None:
    batch = decode_batch(payload(
        {"type": "BlockPinned", "block_hashes": [1]},          # a type added later
        stored(medium="HBM3"),                                 # a medium added later
        stored(block_size=-1), stored(block_hashes="x"),       # malformed
        stored(block_hashes=[1, None]), {"no": "type"}, 5,
        stored(future_field=[1, 2]),                           # unknown field: read
        {"type": "AllBlocksCleared"},
        stored(block_size=0, medium="CPU"),    # vLLM's offloading placeholder: size unknown
    ))
    assert (batch.unknown, batch.malformed) == (2, 5)
    assert batch.events == [("stored", "gpu", [1, 2], 16), ("cleared", "gpu", [], 0),
                            ("stored", "host", [1, 2], 0)]


@pytest.mark.parametrize("raw", [b"\xc1", msgspec.msgpack.encode({"ts": 1}),
                                 msgspec.msgpack.encode([1.0]),
                                 msgspec.msgpack.encode(["t", []])])
def test_a_payload_that_is_no_batch_raises_malformed(raw: bytes) -> None:
    with pytest.raises(MalformedBatch):
        decode_batch(raw)


def test_signed_hashes_and_groups_key_alike_on_every_path() -> None:
    """SGLang's signed hashes and vLLM's groups go through the careful reader, which keys
    them as a batch with an unknown event in it does: a block keyed one way by one replica
    and another way by another would never read as held twice."""
    plain = decode_batch(payload(stored(block_hashes=[-1, 5], group_idx=2)))
    mixed = decode_batch(payload(stored(block_hashes=[-1, 5], group_idx=2), {"type": "New"}))
    assert plain.events == mixed.events
    assert plain.events[0][2] == [block_key(-1, 2), block_key(5, 2)]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(
    st.sampled_from(["BlockStored", "BlockRemoved", "AllBlocksCleared"]),
    st.sampled_from([None, "GPU", "CPU", "CPU_PINNED", "DISK", "HBM"]),
    st.lists(st.integers(-(2**63), 2**64 - 1), max_size=5),
    st.integers(0, 64), st.sampled_from([None, 0, 1]))))
def test_the_typed_reader_reads_what_the_careful_one_does(
        events: list[tuple[str, str | None, list[int], int, int | None]]) -> None:
    raw = [{"type": kind, "block_hashes": hashes, "block_size": size, "group_idx": group,
            **({"medium": medium} if medium else {})} for kind, medium, hashes, size, group
           in events]
    fast, careful = decode_batch(payload(*raw)), _decode_careful(payload(*raw))
    assert (fast.events, fast.unknown, fast.malformed) == \
        (careful.events, careful.unknown, careful.malformed)
