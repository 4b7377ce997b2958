"""The block pool walk in C (``walk_slots``, kernels/pool_walk.c) against its oracle: the
same pass over the blocks by attribute, in Python.

``walk_slots(blocks, hash_member, count_member)`` counts a vLLM pool's blocks holding a
prefix hash, with a reference, and unreferenced holding a hash (reusable cache), reading
the two ``__slots__`` fields at their offsets (kvobs.adapters.vllm.block_pool walks
``pool.blocks`` with it).
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from kvobs.kernels._ext import native


class Block:
    """A vLLM ``KVCacheBlock``'s two fields the walk reads, in ``__slots__``."""

    __slots__ = ("block_hash", "ref_cnt")

    def __init__(self, block_hash: object, ref_cnt: int) -> None:
        self.block_hash = block_hash
        self.ref_cnt = ref_cnt


class SubBlock(Block):
    __slots__ = ("extra",)


MEMBERS = (Block.__dict__["block_hash"], Block.__dict__["ref_cnt"])


def oracle_walk(blocks: list[Any]) -> tuple[int, int, int]:
    """``(hashed, in_use, cached)``, by attribute."""
    hashed = sum(1 for b in blocks if getattr(b, "block_hash", None) is not None)
    in_use = sum(1 for b in blocks if b.ref_cnt)
    cached = sum(1 for b in blocks
                 if getattr(b, "block_hash", None) is not None and not b.ref_cnt)
    return hashed, in_use, cached


@pytest.mark.parametrize("seed", range(5))
def test_the_walk_counts_what_its_oracle_counts(seed: int) -> None:
    rnd = random.Random(seed)
    for _case in range(200):
        blocks: list[Any] = []
        for _ in range(rnd.randrange(0, 300)):
            kind = SubBlock if rnd.random() < 0.1 else Block
            block = kind(rnd.choice((None, b"h", 7, "digest")), rnd.choice((0, 0, 1, 2, 10**20)))
            if rnd.random() < 0.05:
                del block.block_hash  # an unset slot holds no hash
            blocks.append(block)
        assert native.walk_slots(blocks, *MEMBERS) == oracle_walk(blocks)


def test_what_the_walk_cannot_read_is_a_type_error() -> None:
    class Other:
        __slots__ = ("block_hash", "ref_cnt")

        def __init__(self) -> None:
            self.block_hash, self.ref_cnt = None, 0

    class Unslotted:
        block_hash = None

    unset = Block(None, 0)
    del unset.ref_cnt
    for blocks, members, message in (
            ([Block(b"h", 1), Other()], MEMBERS, "a block of another type"),
            ([Block(b"h", True)], MEMBERS, "a reference count that is no int"),
            ([Block(b"h", 1.0)], MEMBERS, "a reference count that is no int"),
            ([unset], MEMBERS, "a reference count that is no int"),
            ([Block(b"h", 1)], (Block.__dict__["block_hash"], "ref_cnt"),
             "expected a __slots__ member descriptor"),
            ([Block(b"h", 1)], (Unslotted.__dict__["block_hash"], MEMBERS[1]),
             "expected a __slots__ member descriptor")):
        with pytest.raises(TypeError, match=message):
            native.walk_slots(blocks, *members)
    with pytest.raises(TypeError):
        native.walk_slots((Block(b"h", 1),), *MEMBERS)  # a list, as vLLM's pool.blocks
    assert native.walk_slots([], *MEMBERS) == (0, 0, 0)
