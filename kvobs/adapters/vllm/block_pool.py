"""vLLM 0.33 ``BlockPool`` -> the GPU tier.

The hot path carries one counting wrapper: ``get_new_blocks`` adds ``num_blocks`` to the
allocations (``count=`` fast path; in C where the extension is built, no Python at all).
``free_blocks`` is not wrapped at all. Everything
else is derived at collection time from the pool's own state plus a few tallies kept on
warm paths (``touch`` per prefix hit, ``cache_*`` per scheduled step, explicit evictions
and resets), using two identities that hold for every sequence of pool calls:

* occupancy, from one walk over ``blocks`` (~10 ns per block in C, see :func:`walk`): in
  use = blocks with a reference, cached = unreferenced blocks that still hold a prefix
  hash. Each block is read once, so a scrape landing inside ``free_blocks`` (reference
  counts dropped before the free queue is updated) still reads
  ``in_use + cached <= capacity``;
* blocks cached beyond a request's prompt (its answer, written during decode) go to the
  recorder's reuse profile as ``written`` (they occupy the cache; the next turn hits them);
* a block gains a hash only in ``cache_full_blocks`` / ``cache_partial_block`` /
  ``move_block_hashes`` and loses it only by eviction, so capacity evictions (cached
  blocks repurposed by ``get_new_blocks``) = hashes gained - hashed now - hashes dropped
  by ``evict_blocks`` / ``reset_prefix_cache``; frees = allocations + reuses - in use, and
  frees that kept their data = cached now + every way a cached block left the cache.

Derived counters never go backwards: the walk is repeated while the engine moves under
it (up to three times), every tally is updated after the engine call it follows (a
reading taken in between is low, never high), and :meth:`BlockPoolInstrumentation.settle`
only ever adds the difference between the highest reading and what it already counted,
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

from kvobs.adapters._hooks import AdapterSpec, Hook, Instrumentation, instrument
from kvobs.kernels._ext import native
from kvobs.recorder import Recorder, TierRecorder
from kvobs.tiers import GPU

COMPONENT = "vllm.block_pool"


class BlockPoolInstrumentation(Instrumentation):
    """Wrappers on one ``BlockPool`` plus the tallies the collection-time walk settles.

    ``hashes_gained`` / ``hashes_dropped`` count blocks that got / lost a prefix hash in
    the wrapped calls; ``reset_pending`` holds the hashes a reset in progress is about to
    drop (so a scrape inside it reads low, never high).
    """

    def __init__(self, pool: Any, rec: Recorder, tier: TierRecorder, active: bool) -> None:
        super().__init__(pool, COMPONENT, active, rec, tier)
        self.hashes_gained = 0
        self.hashes_dropped = 0
        self.reset_pending = 0
        #: a partial block was hashed (``cache_full_blocks`` may then promote hashed blocks)
        self.partial_seen = False
        #: where blocks cached during decode wait for the reuse profile (``rec.written``),
        #: or None: not reported
        self.written_to = rec.written_pending if rec.profile_reuse else None
        self.hash_size = int(getattr(pool, "hash_block_size", 1) or 1)
        self._settle_lock = threading.Lock()

    def settle(self) -> tuple[int, int]:
        """Derive frees and evictions from the pool's state; return ``(in_use, cached)``.

        Called by the tier's snapshot (the resident source), from any thread.
        """
        with self._settle_lock:  # two sinks collecting at once must not both add
            return self._settle()

    def _tallies(self) -> tuple[int, ...]:
        """The engine-side tallies the derivation uses, read together. ``reset_pending``
        is read before ``hashes_dropped`` (a reset adds to the second, then clears the
        first), so a reading inside a reset is low, never high."""
        tier = self.tier
        evictions = tier.evictions
        pending = self.reset_pending
        return (tier.allocations, tier.reuses, self.hashes_gained, pending,
                self.hashes_dropped, evictions["explicit"], evictions["reset"],
                self.target.free_block_queue.num_free_blocks)

    def _settle(self) -> tuple[int, int]:
        pool, tier = self.target, self.tier
        for _ in range(3):
            tallies = self._tallies()
            hashed, in_use, cached = walk(pool.blocks)
            if tallies == self._tallies():
                break
        # Everything below uses the tallies read with the walk, never a fresh read: the
        # engine may move between the walk and here, and a newer tally against the older
        # walk would read high (an allocation counted, its block not yet in use).
        allocations, reuses, gained, pending, dropped, explicit, reset, _free = tallies
        if pool.null_block.ref_cnt:  # vLLM does not maintain it; never count it in use
            in_use -= 1
        capacity = gained - hashed - dropped - pending
        if capacity > tier.evictions_capacity:
            tier.evict(capacity - tier.evictions_capacity, "capacity")
        to_cache = cached + reuses + tier.evictions_capacity + explicit + reset
        if to_cache > tier.frees_to_cache:
            tier.free(to_cache - tier.frees_to_cache, cached=True)
        to_free = allocations + reuses - in_use - tier.frees_to_cache
        if to_free > tier.frees_to_free:
            tier.free(to_free - tier.frees_to_free, cached=False)
        return in_use, cached


def walk(blocks: Sequence[Any]) -> tuple[int, int, int]:
    """``(hashed, in_use, cached)`` over ``blocks``: blocks holding a prefix hash, blocks
    with a reference, and unreferenced blocks holding a hash (reusable cache).

    vLLM's ``KVCacheBlock`` keeps its fields in ``__slots__``: the C extension reads the
    two by their offsets (~10 ns a block, against ~110 in Python) holding the GIL, so the
    engine cannot move during the walk. Elsewhere (no extension, blocks of another shape)
    each block is read once in Python (hash, then reference count), so the three agree
    with one another even while the engine changes the pool.

    Example (needs vLLM)::

        walk(pool.blocks)        # (hashed, in_use, cached), the null block included
    """
    if _walk_slots is not None and type(blocks) is list and blocks:
        members = _slot_members(type(blocks[0]))
        if members is not None:
            try:
                return _walk_slots(blocks, *members)  # type: ignore[no-any-return]
            except TypeError:  # a block of another type, a count that is no int
                pass
    return python_walk(blocks)


def python_walk(blocks: Sequence[Any]) -> tuple[int, int, int]:
    """:func:`walk` in Python, attribute by attribute (the fallback, and its reference)."""
    used_hashed = cached = used = 0
    for block in blocks:
        if block._block_hash is not None:
            if block.ref_cnt:
                used_hashed += 1
            else:
                cached += 1
        elif block.ref_cnt:
            used += 1
    return used_hashed + cached, used + used_hashed, cached


_walk_slots = getattr(native, "walk_slots", None)
_members: dict[type, tuple[Any, Any] | None] = {}


def _slot_members(cls: type) -> tuple[Any, Any] | None:
    """``cls``'s slot descriptors of ``_block_hash`` and ``ref_cnt``, or None where either
    is not a plain slot (a property, an instance dict): found once per class."""
    if cls not in _members:
        found = [next((k.__dict__[name] for k in cls.__mro__ if name in k.__dict__), None)
                 for name in ("_block_hash", "ref_cnt")]
        _members[cls] = (found[0], found[1]) if all(
            isinstance(member, MemberDescriptorType) for member in found) else None
    return _members[cls]


def _hashed(blocks: Iterable[Any]) -> int:
    """Blocks holding a prefix hash (a plain loop: windows are a block or two)."""
    n = 0
    for block in blocks:
        if block._block_hash is not None:
            n += 1
    return n


# -- readers (see kvobs.adapters._hooks: before(inst, *args), after(inst, state, result, *args))

def _touched(inst: BlockPoolInstrumentation, blocks: Sequence[Any]) -> None:
    """The blocks this touch takes out of the free queue, counted before the call (one
    reader, no state carried to an after): those holding a hash are prefix reuses, the
    others plain allocations. ``touch`` changes no hash, and it takes every idle block it
    is given: a touch that raised would leave vLLM's free queue broken anyway."""
    idle = hits = 0
    for block in blocks:
        if not block.ref_cnt and not block.is_null:
            idle += 1
            if block._block_hash is not None:
                hits += 1
    inst.tier.reuse(hits)           # cached -> in use
    inst.tier.allocate(idle - hits)  # a free block without data: a plain allocation


def _cache_full_before(inst: BlockPoolInstrumentation, request: Any, blocks: Sequence[Any],
                       num_cached_blocks: int, num_full_blocks: int,
                       *args: Any, **kwargs: Any) -> int:
    """Blocks of the window this call may hash that hold a hash already (indexed in
    place: no slice, no tuple per call). vLLM hashes only blocks without one, except a
    partial block promoted to full: this read is installed once a ``cache_partial_block``
    was seen (:data:`CACHE_FULL_PROMOTING`); until then the wrapper has no before."""
    n = 0
    for i in range(num_cached_blocks, min(num_full_blocks, len(blocks))):
        if blocks[i]._block_hash is not None:
            n += 1
    return n


def python_cache_full_after(inst: BlockPoolInstrumentation, before: int | None, result: Any,
                            request: Any, blocks: Sequence[Any], num_cached_blocks: int,
                            num_full_blocks: int, block_size: int = 0,
                            kv_cache_group_id: int = 0, *args: Any, **kwargs: Any) -> None:
    """The ``cache_full_blocks`` reader in Python (the fallback, and the C one's
    reference: ``native.cache_full_after`` runs for every block a request fills)."""
    n = -before if before else 0
    for i in range(num_cached_blocks, min(num_full_blocks, len(blocks))):
        if blocks[i]._block_hash is not None:
            n += 1
    inst.hashes_gained += n
    if inst.written_to is not None and not kv_cache_group_id:
        # Blocks cached beyond the prompt: an answer written during decode, reported to
        # the reuse profile as the request's own block hashes (the lookup's keys).
        hash_size = inst.hash_size
        per = block_size // hash_size if block_size else 1
        end = num_full_blocks * per
        start = request.num_prompt_tokens // hash_size
        if start < end:
            inst.rec.written(request.block_hashes[max(num_cached_blocks * per, start):end])


_cache_full_after: Any = getattr(native, "cache_full_after", None) or python_cache_full_after


def _partial_before(inst: BlockPoolInstrumentation, request: Any, block: Any,
                    *args: Any, **kwargs: Any) -> bool:
    if not inst.partial_seen:  # from now on cache_full_blocks may promote hashed blocks
        inst.partial_seen = True
        inst.rewrap(CACHE_FULL_PROMOTING)
    return block._block_hash is not None


def _partial_after(inst: BlockPoolInstrumentation, had: bool, result: Any, request: Any,
                   block: Any, *args: Any, **kwargs: Any) -> None:
    inst.hashes_gained += (block._block_hash is not None) - had


def _move_before(inst: BlockPoolInstrumentation, src_block: Any, dst_block: Any) -> int:
    return _hashed((src_block, dst_block))


def _move_after(inst: BlockPoolInstrumentation, before: int, result: Any, src_block: Any,
                dst_block: Any) -> None:
    inst.hashes_gained += _hashed((src_block, dst_block)) - before


def _evict_before(inst: BlockPoolInstrumentation, block_ids: Iterable[int]) -> list[Any]:
    blocks = inst.target.blocks
    hashed = [blocks[i] for i in set(block_ids)
              if 0 <= i < len(blocks) and blocks[i]._block_hash is not None]
    inst.hashes_dropped += len(hashed)  # before the drop: readings stay low
    return hashed


def _evict_after(inst: BlockPoolInstrumentation, hashed: list[Any], result: Any,
                 block_ids: Iterable[int]) -> None:
    inst.hashes_dropped -= sum(1 for b in hashed if b._block_hash is not None)  # kept theirs
    freed = sum(1 for b in hashed if b._block_hash is None and not b.ref_cnt)
    inst.tier.evict(freed, "explicit")  # cached -> free; in-use blocks only lose the hash


def _reset_before(inst: BlockPoolInstrumentation) -> int:
    pool = inst.target
    if pool.num_gpu_blocks - pool.get_num_free_blocks() != 1:
        return 0  # vLLM refuses to reset while blocks are in use: nothing to read
    hashed, _, cached = walk(pool.blocks)
    inst.reset_pending = hashed  # a scrape during the reset reads low, never high
    return cached


def _reset_after(inst: BlockPoolInstrumentation, cached: int, done: bool) -> None:
    if done:  # counted only once vLLM said it reset: no counter is ever taken back
        inst.hashes_dropped += inst.reset_pending
        inst.tier.evict(cached, "reset")
    inst.reset_pending = 0


SPEC = AdapterSpec(COMPONENT, ("BlockPool",), (
    Hook("get_new_blocks", ("num_blocks",), "allocate", count="num_blocks"),
    Hook("touch", ("blocks",), "reuse, allocate", before=_touched, reiterable=("blocks",)),
    Hook("cache_full_blocks", ("request", "blocks", "num_cached_blocks", "num_full_blocks"),
         "track", after=_cache_full_after),
    Hook("cache_partial_block", ("request", "block"), "track", before=_partial_before,
         after=_partial_after),
    Hook("move_block_hashes", ("src_block", "dst_block"), "track", before=_move_before,
         after=_move_after),
    Hook("evict_blocks", ("block_ids",), "evict", before=_evict_before, after=_evict_after,
         reiterable=("block_ids",)),
    Hook("reset_prefix_cache", (), "evict", before=_reset_before, after=_reset_after),
), state=("num_gpu_blocks", "hash_block_size", "blocks", "free_block_queue.num_free_blocks",
          "null_block._block_hash", "null_block.ref_cnt", "null_block.is_null",
          "free_blocks", "get_num_free_blocks"))
"""The pool's hooks. ``free_blocks`` is checked (in ``state``), never wrapped: frees are
derived at collection (see the module docstring)."""

#: ``cache_full_blocks`` once a partial block was hashed: a window may then hold a block
#: promoted from partial to full, whose hash is not new (read before the call).
CACHE_FULL_PROMOTING = Hook(
    "cache_full_blocks", ("request", "blocks", "num_cached_blocks", "num_full_blocks"),
    "track", before=_cache_full_before, after=_cache_full_after)


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
        gpu = inst.tier
        gpu.set_resident_source(inst.settle)
        inst.on_unwrap(lambda: gpu.set_resident_source(None))
    return inst


def pool_capacity(pool: Any) -> int:
    """Usable blocks: every block but the null placeholder (what ``get_usage`` divides by)."""
    return max(int(getattr(pool, "num_gpu_blocks", 1)) - 1, 0)
