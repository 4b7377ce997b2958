"""The vLLM readers in C count what their Python references count.

``get_new_blocks`` (``kvobs.adapters.vllm.block_pool``):

They run on every allocation of a vLLM pool: ``native.new_blocks_before`` must count the
same hashed blocks among the free queue's first ``num_blocks`` as
``block_pool.python_new_blocks_before`` (blocks read by slot offset, as attributes where
the class has no slots or a block is of another type, a queue shorter than asked), and
``native.new_blocks_after`` must add the same allocations and capacity evictions as
``block_pool.python_new_blocks_after`` (a C tier counted in place, any other through its
methods), arguments by position or by keyword. (The real engine suites run the C readers
against vLLM's own counts; the mutation check runs the Python ones.)

The releases of a request's blocks (``kvobs.adapters.vllm.lookups``):
``native.release_before`` must pick the same block hashes (a request's cached blocks
beyond its prompt) as ``lookups.python_release_before``, and ``native.release_after`` must
leave the recorder's written blocks as ``lookups.python_release_after`` does (through
``Recorder.written``: appended, or flushed past ``WRITTEN_MAX``).
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from kvobs.adapters.vllm import block_pool, lookups
from kvobs.kernels._ext import native
from kvobs.recorder import WRITTEN_MAX, PyTierCore, Recorder, TierRecorder

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


def release_state(rnd: random.Random, pending: int) -> tuple:
    rec = Recorder()
    rec.written_pending.extend(f"w{i}".encode() for i in range(pending))
    hash_size = rnd.choice([16, 32])
    inst = SimpleNamespace(rec=rec, written_to=rec.written_pending, hash_size=hash_size,
                           hashes_per_block=rnd.choice([1, 1, 2, 4]),
                           cached_blocks={f"r{i}": rnd.randrange(0, 12) for i in range(4)})
    request = SimpleNamespace(request_id=f"r{rnd.randrange(6)}",  # r4, r5: none cached
                              num_prompt_tokens=rnd.randrange(0, 300),
                              block_hashes=[f"k{i}".encode() for i in range(rnd.randrange(50))])
    return inst, request


@pytest.mark.parametrize("seed", range(5))
def test_the_c_release_readers_write_what_the_python_ones_write(seed):
    for case in range(300):
        pending = random.Random(case).choice([0, 5, WRITTEN_MAX - 3, WRITTEN_MAX])
        pair = [release_state(random.Random(seed * 1000 + case), pending) for _ in range(2)]
        by_keyword = case % 3 == 0
        results = []
        for (before, after), (inst, request) in zip(
                ((native.release_before, native.release_after),
                 (lookups.python_release_before, lookups.python_release_after)), pair,
                strict=True):
            keys = before(inst=inst, request=request) if by_keyword else before(inst, request)
            results.append(keys)
            if by_keyword:
                after(inst=inst, keys=keys, result=None, request=request)
            else:
                after(inst, keys, None, request)
        assert results[0] == results[1]
        assert pair[0][0].rec.written_pending == pair[1][0].rec.written_pending


def test_a_release_past_the_bound_flushes_through_the_recorder():
    rec = Recorder(profile_reuse=False)
    rec.written_pending.extend(range(WRITTEN_MAX - 1))
    inst = SimpleNamespace(rec=rec, written_to=rec.written_pending, hash_size=16,
                           hashes_per_block=1, cached_blocks={"a": 3})
    request = SimpleNamespace(request_id="a", num_prompt_tokens=16, block_hashes=[0, 1, 2])
    keys = native.release_before(inst, request)
    assert keys == [1, 2]
    native.release_after(inst, [1], None, request)
    assert rec.written_pending == [*range(WRITTEN_MAX - 1), 1]  # in place: it fits
    native.release_after(inst, keys, None, request)
    assert rec.written_pending == []  # 4,098 would wait: flushed
    native.release_after(inst, None, None, request)
    native.release_after(inst, [], None, request)
    assert rec.written_pending == []


def test_bad_release_arguments_raise_as_python_would():
    inst = SimpleNamespace(cached_blocks=None, hash_size=16, hashes_per_block=1)
    request = SimpleNamespace(request_id="a", num_prompt_tokens=0, block_hashes=[])
    for reader in (native.release_before, lookups.python_release_before):
        with pytest.raises((TypeError, AttributeError)):
            reader(inst, request)
    with pytest.raises(TypeError):
        native.release_before(inst)


@pytest.mark.parametrize("seed", range(3))
def test_the_bound_pool_reader_counts_what_the_python_readers_count(seed):
    """``PoolReader``: both readers of one pool in one C object (its queue's head, slot
    offsets and tier held in it), called as a before (two arguments) and an after (four)."""
    rnd = random.Random(seed)
    for _case in range(300):
        walk = queue(rnd, Block, odd=rnd.random() < 0.2)
        tiers = [TierRecorder("gpu", 100, 16, 0) for _ in range(2)]
        reader = native.PoolReader(*walk, tiers[0])
        inst = SimpleNamespace(free_walk=walk, tier=tiers[1])
        n = rnd.randrange(0, 16)
        evicted = block_pool.python_new_blocks_before(inst, n)
        assert reader(None, n) == reader(None, num_blocks=n) == evicted
        reader(None, evicted, [], n)
        block_pool.python_new_blocks_after(inst, evicted, [], n)
        assert (tiers[0].allocations, tiers[0].evictions_capacity) == \
            (tiers[1].allocations, tiers[1].evictions_capacity) == (n, evicted)
    with pytest.raises(TypeError):
        native.PoolReader(*walk, PyTierCore())  # a tier in Python: the module's readers
    with pytest.raises(TypeError):
        reader(None, 1, 2)
