"""The vLLM ``get_new_blocks`` readers in C count what their Python references count.

They run on every allocation of a vLLM pool: ``native.new_blocks_before`` must count the
same hashed blocks among the free queue's first ``num_blocks`` as
``block_pool.python_new_blocks_before`` (blocks read by slot offset, as attributes where
the class has no slots or a block is of another type, a queue shorter than asked), and
``native.new_blocks_after`` must add the same allocations and capacity evictions as
``block_pool.python_new_blocks_after`` (a C tier counted in place, any other through its
methods), arguments by position or by keyword. (The real engine suites run the C readers
against vLLM's own counts; the mutation check runs the Python ones.)
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from kvobs.adapters.vllm import block_pool
from kvobs.kernels._ext import native
from kvobs.recorder import PyTierCore, TierRecorder

pytestmark = pytest.mark.skipif(getattr(native, "new_blocks_before", None) is None,
                                reason="the C extension is not built here")


class Block:
    __slots__ = ("_block_hash", "next_free_block")

    def __init__(self, hashed: bool) -> None:
        self._block_hash = b"h" if hashed else None
        self.next_free_block = None


class Unslotted:
    def __init__(self, hashed: bool) -> None:
        self._block_hash = b"h" if hashed else None
        self.next_free_block = None


def queue(rnd: random.Random, kind: type, odd: bool) -> tuple:
    """``free_walk`` of a queue: a fake head, then blocks (a tail with no hash ending it,
    as vLLM's fake tail; an unslotted stranger among slotted blocks where ``odd``)."""
    head = kind(False)
    block = head
    for i in range(rnd.randrange(0, 12)):
        cls = Unslotted if odd and i == 2 else kind
        block.next_free_block = cls(rnd.random() < 0.6)
        block = block.next_free_block
    if rnd.random() < 0.8:
        block.next_free_block = kind(False)  # the fake tail
    members = block_pool._queue_members(kind)
    return (head, *(members or (None, None)))


@pytest.mark.parametrize("seed", range(5))
def test_the_c_before_counts_the_hashed_blocks_the_python_one_counts(seed):
    rnd = random.Random(seed)
    for _case in range(500):
        kind = rnd.choice([Block, Block, Unslotted])
        inst = SimpleNamespace(free_walk=queue(rnd, kind, odd=rnd.random() < 0.2))
        n = rnd.randrange(0, 16)
        expected = block_pool.python_new_blocks_before(inst, n)
        assert native.new_blocks_before(inst, n) == expected
        assert native.new_blocks_before(inst, num_blocks=n) == expected
        assert native.new_blocks_before(inst=inst, num_blocks=n) == expected


def test_slots_are_read_by_offset_and_a_class_without_them_by_attribute():
    assert block_pool._queue_members(Block) is not None
    assert block_pool._queue_members(Unslotted) is None
    head = Block(False)
    head.next_free_block = Block(True)
    head.next_free_block.next_free_block = Block(True)
    inst = SimpleNamespace(free_walk=(head, *block_pool._queue_members(Block)))
    assert native.new_blocks_before(inst, 1) == 1
    assert native.new_blocks_before(inst, 5) == 2  # the queue ends first
    assert native.new_blocks_before(inst, 0) == native.new_blocks_before(inst, -3) == 0


@pytest.mark.parametrize("tier_class", [TierRecorder, PyTierCore])
def test_the_c_after_counts_what_the_python_one_counts(tier_class):
    rnd = random.Random(7)
    for _case in range(200):
        tiers = [TierRecorder("gpu", 100, 16, 0) if tier_class is TierRecorder
                 else PyTierCore() for _ in range(2)]
        for tier in tiers:
            if tier_class is PyTierCore:
                tier.allocations = tier.evictions_capacity = 0
                tier.evictions = {"capacity": 0, "explicit": 0, "reset": 0, "other": 0}
                tier.thrash = tier.residency = None
        calls = [(rnd.randrange(0, 5), rnd.randrange(0, 9)) for _ in range(rnd.randrange(6))]
        for (evicted, n) in calls:
            if rnd.random() < 0.5:
                native.new_blocks_after(SimpleNamespace(tier=tiers[0]), evicted, [], n)
            else:
                native.new_blocks_after(inst=SimpleNamespace(tier=tiers[0]), evicted=evicted,
                                        result=[], num_blocks=n)
            block_pool.python_new_blocks_after(SimpleNamespace(tier=tiers[1]), evicted, [], n)
        for tier in tiers:
            assert (tier.allocations, tier.evictions_capacity) == (
                sum(n for _e, n in calls), sum(e for e, _n in calls))


def test_bad_arguments_raise_as_python_would():
    with pytest.raises(TypeError):
        native.new_blocks_before(SimpleNamespace(free_walk=None), 1)
    with pytest.raises(TypeError):
        native.new_blocks_before(SimpleNamespace(free_walk=(Block(False), None, None)))
    with pytest.raises(AttributeError):
        native.new_blocks_after(SimpleNamespace(), 0, None, 1)
