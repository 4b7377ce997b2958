"""vLLM 0.33 ``BlockPool`` -> the GPU tier.

The hot path carries one wrapper: ``get_new_blocks`` adds ``num_blocks`` to the
allocations and counts the capacity evictions it makes (below; both readers in C where
the extension is built). ``free_blocks`` is not wrapped at all, nor are the calls that
hash blocks (``cache_full_blocks``, ``cache_partial_block``, ``move_block_hashes``).
Everything else is derived at collection time from the pool's own state plus a few
tallies kept on warm paths (``touch`` per prefix hit, explicit evictions and resets):

* occupancy, from one walk over ``blocks`` (~10 ns per block in C, see :func:`walk`): in
  use = blocks with a reference, cached = unreferenced blocks that still hold a prefix
  hash. Each block is read once, so a scrape landing inside ``free_blocks`` (reference
  counts dropped before the free queue is updated) still reads
  ``in_use + cached <= capacity``;
* capacity evictions are counted where vLLM makes them: ``get_new_blocks(n)`` pops the
  first ``n`` blocks of ``free_block_queue`` and drops the prefix hash of each that holds
  one (``_maybe_evict_cached_block``). Its ``before`` reader walks the queue's first ``n``
  blocks and counts those holding a hash; the count is added once the call returned
  (it raises ``ValueError`` before popping anything when too few blocks are free). A
  pool without prefix caching evicts nothing: there the wrapper only counts;
* frees = allocations + reuses - in use, and frees that kept their data = cached now +
  every way a cached block left the cache (prefix reuses, capacity, explicit and reset
  evictions).

Blocks an answer wrote during decode go to the reuse profile when their request's blocks
are freed (:mod:`kvobs.adapters.vllm.lookups`), not here.

Derived counters never go backwards: every tally is updated after the engine call it
follows, and the collection reads the tallies *before* its walk over the blocks (the walk
is repeated while the engine moves under it, up to three times): a tally older than the
walk reads low, never high (an eviction counted only after its block left the cache, an
allocation only after its block is in use). :meth:`BlockPoolInstrumentation.settle` only
ever adds the difference between the highest reading and what it already counted,
through the ordinary :class:`~kvobs.events.TierEvents` calls.

Example (needs vLLM)::

    from vllm.v1.core.block_pool import BlockPool
    pool = BlockPool(num_gpu_blocks=1000, enable_caching=True, hash_block_size=16)
    inst = instrument_block_pool(pool, rec, block_bytes=131072)
    pool.free_blocks(pool.get_new_blocks(4))
    rec.snapshot().tier("gpu").frees     # 4
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from types import MemberDescriptorType
from typing import Any

from kvobs.adapters.api import AdapterSpec, Hook, Instrumentation, instrument
from kvobs.kernels._ext import native
from kvobs.recorder import Recorder, TierRecorder
from kvobs.tiers import GPU

COMPONENT = "vllm.block_pool"


class BlockPoolInstrumentation(Instrumentation):
    """Wrappers on one ``BlockPool`` plus the tallies the collection-time walk settles.

    ``free_head`` is where the ``get_new_blocks`` reader starts: the free queue's fake
    head (a block that never leaves the queue; vLLM links the free blocks after it).
    """

    def __init__(self, pool: Any, rec: Recorder, tier: TierRecorder, active: bool) -> None:
        super().__init__(pool, COMPONENT, active, rec, tier)
        queue = getattr(pool, "free_block_queue", None)
        self.free_head: Any = getattr(queue, "fake_free_list_head", None)
        self._settle_lock = threading.Lock()

    def settle(self) -> tuple[int, int]:
        """Derive frees from the pool's state; return ``(in_use, cached)``.

        Called by the tier's snapshot (the resident source), from any thread.
        """
        with self._settle_lock:  # two sinks collecting at once must not both add
            return self._settle()

    def _tallies(self) -> tuple[int, ...]:
        """The engine-side tallies the derivation uses, read together (each is updated
        after the engine call it follows)."""
        tier = self.tier
        evictions = tier.evictions
        return (tier.allocations, tier.reuses, tier.evictions_capacity,
                evictions["explicit"], evictions["reset"],
                self.target.free_block_queue.num_free_blocks)

    def _settle(self) -> tuple[int, int]:
        pool, tier = self.target, self.tier
        for _ in range(3):
            tallies = self._tallies()
            _hashed, in_use, cached = walk(pool.blocks)
            if tallies == self._tallies():
                break
        # Everything below uses the tallies read before the walk, never a fresh read: the
        # engine may move between the walk and here, and a newer tally against the older
        # walk would read high (an allocation counted, its block not yet in use; an
        # eviction counted, its block still cached in the walk).
        allocations, reuses, capacity, explicit, reset, _free = tallies
        if pool.null_block.ref_cnt:  # vLLM does not maintain it; never count it in use
            in_use -= 1
        to_cache = cached + reuses + capacity + explicit + reset
        if to_cache > tier.frees_to_cache:
            tier.free(to_cache - tier.frees_to_cache, cached=True)
        to_free = allocations + reuses - in_use - tier.frees_to_cache
        if to_free > tier.frees_to_free:
            tier.free(to_free - tier.frees_to_free, cached=False)
        return in_use, cached


def walk(blocks: list[Any]) -> tuple[int, int, int]:
    """``(hashed, in_use, cached)`` over ``blocks``: blocks holding a prefix hash, blocks
    with a reference, and unreferenced blocks holding a hash (reusable cache).

    vLLM's ``KVCacheBlock`` keeps its fields in ``__slots__``: the C walk reads the two
    by their offsets (~10 ns a block) holding the GIL, so the engine cannot move during
    it and each block is read once.

    Raises:
        TypeError: a block of another type than the first, or without those slots.

    Example (needs vLLM)::

        walk(pool.blocks)        # (hashed, in_use, cached), the null block included
    """
    members = slot_members(type(blocks[0])) if blocks else None
    if members is None:
        raise TypeError("vLLM's blocks keep their hash and reference count in no __slots__")
    return walk_slots(blocks, *members)  # type: ignore[no-any-return]


walk_slots: Any = getattr(native, "walk_slots", None)
_members: dict[type, tuple[Any, Any] | None] = {}


def slot_members(cls: type) -> tuple[Any, Any] | None:
    """``cls``'s slot descriptors of its block hash and ``ref_cnt``, or None where either
    is no plain slot: found once per class. The hash is the public ``block_hash`` field
    (vLLM 0.34 on), else the ``_block_hash`` slot behind vLLM 0.33's ``block_hash``
    property (a property read costs a Python call a block)."""
    if cls not in _members:
        def member(name: str) -> Any:
            found = next((k.__dict__[name] for k in cls.__mro__ if name in k.__dict__), None)
            return found if isinstance(found, MemberDescriptorType) else None

        found = (member("block_hash") or member("_block_hash"), member("ref_cnt"))
        _members[cls] = (found[0], found[1]) if all(found) else None
    return _members[cls]


# -- readers (see kvobs.adapters._hooks: before(inst, *args), after(inst, state, result, *args))

def _new_blocks_before(inst: BlockPoolInstrumentation, num_blocks: int,
                       *args: Any, **kwargs: Any) -> int:
    """Blocks ``get_new_blocks(num_blocks)`` is about to evict: of the first
    ``num_blocks`` blocks of the free queue (those it pops), the ones holding a prefix
    hash. It runs on every allocation of a caching pool."""
    block = inst.free_head
    n = 0
    for _ in range(num_blocks):
        block = block.next_free_block
        if block is None:
            break
        if block.block_hash is not None:
            n += 1
    return n


def _new_blocks_after(inst: BlockPoolInstrumentation, evicted: int, result: Any,
                      num_blocks: int, *args: Any, **kwargs: Any) -> None:
    """``get_new_blocks`` returned: ``num_blocks`` allocations, of which ``evicted``
    repurposed a cached block (capacity evictions)."""
    tier = inst.tier
    tier.allocate(num_blocks)
    if evicted:
        tier.evict(evicted, "capacity")


def _touched(inst: BlockPoolInstrumentation, blocks: Sequence[Any]) -> None:
    """The blocks this touch takes out of the free queue, counted before the call (one
    reader, no state carried to an after): those holding a hash are prefix reuses, the
    others plain allocations. ``touch`` changes no hash, and it takes every idle block it
    is given: a touch that raised would leave vLLM's free queue broken anyway."""
    idle = hits = 0
    for block in blocks:
        if not block.ref_cnt and not block.is_null:
            idle += 1
            if block.block_hash is not None:
                hits += 1
    inst.tier.reuse(hits)           # cached -> in use
    inst.tier.allocate(idle - hits)  # a free block without data: a plain allocation


def _evict_before(inst: BlockPoolInstrumentation, block_ids: Iterable[int]) -> list[Any]:
    blocks = inst.target.blocks
    return [blocks[i] for i in set(block_ids)
            if 0 <= i < len(blocks) and blocks[i].block_hash is not None]


def _evict_after(inst: BlockPoolInstrumentation, hashed: list[Any], result: Any,
                 block_ids: Iterable[int]) -> None:
    freed = sum(1 for b in hashed if b.block_hash is None and not b.ref_cnt)
    inst.tier.evict(freed, "explicit")  # cached -> free; in-use blocks only lose the hash


def _reset_before(inst: BlockPoolInstrumentation) -> int:
    pool = inst.target
    if pool.num_gpu_blocks - pool.get_num_free_blocks() != 1:
        return 0  # vLLM refuses to reset while blocks are in use: nothing to read
    return walk(pool.blocks)[2]


def _reset_after(inst: BlockPoolInstrumentation, cached: int, done: bool) -> None:
    if done:  # counted only once vLLM said it reset: no counter is ever taken back
        inst.tier.evict(cached, "reset")


SPEC = AdapterSpec(COMPONENT, ("BlockPool",), (
    Hook("get_new_blocks", ("num_blocks",), "allocate, evict", before=_new_blocks_before,
         after=_new_blocks_after),
    Hook("touch", ("blocks",), "reuse, allocate", before=_touched, reiterable=("blocks",)),
    Hook("evict_blocks", ("block_ids",), "evict", before=_evict_before, after=_evict_after,
         reiterable=("block_ids",)),
    Hook("reset_prefix_cache", (), "evict", before=_reset_before, after=_reset_after),
), state=("num_gpu_blocks", "hash_block_size", "enable_caching", "blocks",
          "free_block_queue.num_free_blocks",
          "free_block_queue.fake_free_list_head.next_free_block",
          "null_block.block_hash", "null_block.ref_cnt", "null_block.is_null",
          "free_blocks", "get_num_free_blocks"))
"""The pool's hooks. ``free_blocks`` is checked (in ``state``), never wrapped: frees are
derived at collection (see the module docstring)."""

#: ``get_new_blocks`` of a pool without prefix caching: no block ever holds a hash there
#: and vLLM evicts nothing, so the allocations are all there is to count (``count=``:
#: no reader at all).
COUNT_ONLY = Hook("get_new_blocks", ("num_blocks",), "allocate", count="num_blocks")


def instrument_block_pool(pool: Any, rec: Recorder, *, tier: str = GPU,
                          block_tokens: int | None = None, block_bytes: int = 0,
                          role: str = "", request_blocks: int = 0,
                          ) -> BlockPoolInstrumentation:
    """Count a vLLM ``BlockPool`` as tier ``tier`` of ``rec``.

    Args:
        pool: the engine's ``BlockPool`` (``kv_cache_manager.block_pool``).
        rec: the recorder to count into.
        tier: tier name (``gpu``).
        block_tokens: tokens per block; defaults to the pool's ``hash_block_size``.
        block_bytes: bytes per block across all layers (0 if unknown); see
            :func:`kvobs.adapters.vllm.capacity.gpu_tier_capacity`.
        role: the tier's role (``primary`` / ``cache``; default by name), and
            ``request_blocks`` the blocks one request needs there (0: by tokens); see
            :meth:`kvobs.recorder.Recorder.add_tier`.

    Returns:
        The instrumentation; ``.unwrap()`` restores the pool. It is inactive (nothing
        wrapped, one warning naming the missing attribute) on a vLLM whose ``BlockPool``
        kvobs does not know.

    Raises:
        AdapterError: ``pool`` is not a BlockPool or is already instrumented.
    """
    def make(active: bool) -> BlockPoolInstrumentation:
        tokens = block_tokens or int(getattr(pool, "hash_block_size", 1))
        capacity = pool_capacity(pool)
        recorder = rec.add_tier(tier, capacity, tokens, block_bytes, role=role,
                                request_blocks=request_blocks) if active else \
            TierRecorder(tier, capacity, tokens, block_bytes)  # an unknown pool exports nothing
        return BlockPoolInstrumentation(pool, rec, recorder, active)

    inst = instrument(pool, SPEC, make)
    if inst.active:
        if not pool.enable_caching:
            inst.rewrap(COUNT_ONLY)
        gpu = inst.tier
        gpu.set_resident_source(inst.settle)
        inst.on_unwrap(lambda: gpu.set_resident_source(None))
    return inst


def pool_capacity(pool: Any) -> int:
    """Usable blocks: every block but the null placeholder (what ``get_usage`` divides by)."""
    return max(int(getattr(pool, "num_gpu_blocks", 1)) - 1, 0)
