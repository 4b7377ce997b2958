"""vLLM 0.33 ``BlockPool`` -> the GPU tier.

The hot path carries one thin wrapper: ``get_new_blocks`` adds ``num_blocks`` to the
allocation counter. ``free_blocks`` is not wrapped at all. Everything else is derived
at collection time from the pool's own state plus a few counters kept on warm paths
(``touch`` per prefix hit, ``cache_full_blocks`` per scheduled step, explicit evictions
and resets), using two identities that hold for every sequence of pool calls:

* occupancy: ``in_use = num_gpu_blocks - 1 - get_num_free_blocks()`` (the null block is
  never free), ``cached`` = free blocks that still hold a prefix hash (a walk over
  ``blocks`` at collection, ~50 ns per block);
* a block gains a hash only in ``cache_full_blocks``/``cache_partial_block``/
  ``move_block_hashes`` and loses it only by eviction, so capacity evictions (cached
  blocks repurposed by ``get_new_blocks``) = hashes gained - hashed now - hashes dropped
  by ``evict_blocks``/``reset_prefix_cache``; frees = allocations + reuses - in use, and
  frees that kept their data = cached now + every way a cached block left the cache.

Derived counters never go backwards: the walk is repeated while the engine moves under
it (up to three times), and a reading taken mid-update is held until the truth passes it.

Example:
    >>> from vllm.v1.core.block_pool import BlockPool        # doctest: +SKIP
    >>> pool = BlockPool(num_gpu_blocks=1000, enable_caching=True, hash_block_size=16)
    >>> inst = instrument_block_pool(pool, rec, block_bytes=131072)  # doctest: +SKIP
    >>> pool.free_blocks(pool.get_new_blocks(4))                     # doctest: +SKIP
    >>> rec.snapshot().tier("gpu").frees                             # doctest: +SKIP
    4
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from kvobs.adapters._hooks import Hook, Instrumentation, begin
from kvobs.recorder import Recorder, TierRecorder
from kvobs.tiers import GPU

COMPONENT = "vllm.block_pool"

HOOKS = (
    Hook("get_new_blocks", ("num_blocks",)),
    Hook("free_blocks", ("ordered_blocks",)),
    Hook("touch", ("blocks",)),
    Hook("cache_full_blocks", ("request", "blocks", "num_cached_blocks", "num_full_blocks")),
    Hook("cache_partial_block", ("request", "block")),
    Hook("move_block_hashes", ("src_block", "dst_block")),
    Hook("evict_blocks", ("block_ids",)),
    Hook("reset_prefix_cache", ()),
    Hook("get_num_free_blocks", ()),
)
#: State the collection-time walk reads; checked with the hooks.
STATE = ("num_gpu_blocks", "hash_block_size", "blocks", "free_block_queue.num_free_blocks",
         "null_block._block_hash", "null_block.ref_cnt", "null_block.is_null")


class BlockPoolInstrumentation(Instrumentation):
    """Wrappers on one ``BlockPool`` plus the counters the collection-time walk settles."""

    def __init__(self, pool: Any, rec: Recorder, tier: TierRecorder, active: bool) -> None:
        super().__init__(pool, COMPONENT, active)
        self.rec = rec
        self.tier = tier
        self.hashes_gained = 0   # net blocks that got a prefix hash in cache_* calls
        self.hashes_dropped = 0  # blocks that lost it in evict_blocks / reset_prefix_cache
        self.frees = 0           # highest derived readings (see settle)
        self.frees_to_cache = 0

    def settle(self) -> tuple[int, int]:
        """Derive frees and evictions from the pool's state; return ``(in_use, cached)``."""
        pool, tier = self.target, self.tier
        for _ in range(3):
            before = (tier.allocations, tier.reuses, self.hashes_gained,
                      pool.free_block_queue.num_free_blocks)
            hashed, cached = _walk(pool.blocks)
            in_use = pool.num_gpu_blocks - 1 - pool.free_block_queue.num_free_blocks
            if before == (tier.allocations, tier.reuses, self.hashes_gained,
                          pool.free_block_queue.num_free_blocks):
                break
        # Every wrapper updates its counter after the engine call it follows (and
        # hashes_dropped before the drop), so a reading taken between the two is low,
        # never high: holding the highest reading is exact once the engine pauses.
        capacity = self.hashes_gained - hashed - self.hashes_dropped
        tier.evictions_capacity = max(tier.evictions_capacity, capacity)
        to_cache = (cached + tier.reuses + tier.evictions_capacity
                    + tier.evictions["explicit"] + tier.evictions["reset"])
        self.frees_to_cache = max(self.frees_to_cache, to_cache)
        self.frees = max(self.frees, tier.allocations + tier.reuses - in_use)
        tier.frees_to_cache = self.frees_to_cache
        tier.frees_to_free = max(self.frees - self.frees_to_cache, 0)  # the sum is exact
        return in_use, cached


def _walk(blocks: Sequence[Any]) -> tuple[int, int]:
    """Blocks holding a prefix hash, and those of them that are free (reusable cache)."""
    hashed = cached = 0
    for block in blocks:
        if block._block_hash is not None:
            hashed += 1
            if not block.ref_cnt:
                cached += 1
    return hashed, cached


def _hashed(blocks: Iterable[Any]) -> int:
    return sum(1 for block in blocks if block._block_hash is not None)


def instrument_block_pool(pool: Any, rec: Recorder, *, tier: str = GPU,
                          block_tokens: int | None = None,
                          block_bytes: int = 0) -> BlockPoolInstrumentation:
    """Count a vLLM ``BlockPool`` as tier ``tier`` of ``rec``.

    Args:
        pool: the engine's ``BlockPool`` (``kv_cache_manager.block_pool``).
        rec: the recorder to count into.
        tier: tier name (``gpu``).
        block_tokens: tokens per block; defaults to the pool's ``hash_block_size``.
        block_bytes: bytes per block across all layers (0 if unknown); see
            :func:`kvobs.adapters.vllm.capacity.gpu_tier_capacity`.

    Returns:
        The instrumentation; ``.unwrap()`` restores the pool. It is inactive (nothing
        wrapped, one warning logged) on a vLLM whose ``BlockPool`` kvobs does not know.

    Raises:
        AdapterError: ``pool`` is not a BlockPool or is already instrumented.
    """
    def make(active: bool) -> BlockPoolInstrumentation:
        tokens = block_tokens or int(getattr(pool, "hash_block_size", 1))
        add = rec.add_tier if active else TierRecorder  # an unknown pool exports nothing
        return BlockPoolInstrumentation(pool, rec, add(tier, pool_capacity(pool), tokens,
                                                       block_bytes), active)

    inst = begin(pool, ("BlockPool",), HOOKS, COMPONENT, make, STATE)
    gpu = inst.tier
    if inst.active:
        _install(inst, pool, rec, gpu)
        gpu.set_resident_source(inst.settle)
        inst.on_unwrap(lambda: gpu.set_resident_source(None))
    return inst


def pool_capacity(pool: Any) -> int:
    """Usable blocks: every block but the null placeholder (what ``get_usage`` divides by)."""
    return max(int(getattr(pool, "num_gpu_blocks", 1)) - 1, 0)


def _install(inst: BlockPoolInstrumentation, pool: Any, rec: Recorder, gpu: TierRecorder) -> None:
    error = rec.error
    get_new_blocks: Callable[[int], Any] = pool.get_new_blocks
    touch = pool.touch
    cache_full_blocks = pool.cache_full_blocks
    cache_partial_block = pool.cache_partial_block
    move_block_hashes = pool.move_block_hashes
    evict_blocks = pool.evict_blocks
    reset_prefix_cache = pool.reset_prefix_cache

    def get_new_blocks_hook(num_blocks: int) -> Any:
        blocks = get_new_blocks(num_blocks)
        try:
            gpu.allocations += num_blocks
        except Exception as exc:
            error(COMPONENT, exc)
        return blocks

    def touch_hook(blocks: Sequence[Any]) -> None:
        if not isinstance(blocks, (list, tuple)):
            blocks = list(blocks)  # read it twice without consuming the engine's iterator
        try:
            idle = [b for b in blocks if not b.ref_cnt and not b.is_null]
        except Exception as exc:
            error(COMPONENT, exc)
            idle = []
        touch(blocks)
        try:
            hits = _hashed(idle)
            gpu.reuses += hits              # cached -> in use
            gpu.allocations += len(idle) - hits  # a free block without data: plain allocation
        except Exception as exc:
            error(COMPONENT, exc)

    def cache_full_blocks_hook(request: Any, blocks: Sequence[Any], num_cached_blocks: int,
                               num_full_blocks: int, *args: Any, **kwargs: Any) -> None:
        try:
            window = blocks[num_cached_blocks:num_full_blocks]
            before = _hashed(window)
        except Exception as exc:
            error(COMPONENT, exc)
            window, before = [], 0
        cache_full_blocks(request, blocks, num_cached_blocks, num_full_blocks, *args, **kwargs)
        try:
            inst.hashes_gained += _hashed(window) - before
        except Exception as exc:
            error(COMPONENT, exc)

    def cache_partial_block_hook(request: Any, block: Any, *args: Any, **kwargs: Any) -> Any:
        had = getattr(block, "_block_hash", None) is not None
        result = cache_partial_block(request, block, *args, **kwargs)
        try:
            inst.hashes_gained += (block._block_hash is not None) - had
        except Exception as exc:
            error(COMPONENT, exc)
        return result

    def move_block_hashes_hook(src_block: Any, dst_block: Any) -> None:
        pair = (src_block, dst_block)
        try:
            before = _hashed(pair)
        except Exception as exc:
            error(COMPONENT, exc)
            before = 0
        move_block_hashes(src_block, dst_block)
        try:
            inst.hashes_gained += _hashed(pair) - before
        except Exception as exc:
            error(COMPONENT, exc)

    def evict_blocks_hook(block_ids: Any) -> None:
        try:
            ids = set(block_ids)
            targets = [pool.blocks[i] for i in ids if 0 <= i < len(pool.blocks)]
            hashed = [b for b in targets if b._block_hash is not None]
            inst.hashes_dropped += len(hashed)   # before the drop: readings stay low
        except Exception as exc:
            error(COMPONENT, exc)
            ids, hashed = block_ids, []
        evict_blocks(ids)
        try:
            inst.hashes_dropped -= sum(1 for b in hashed if b._block_hash is not None)
            freed = sum(1 for b in hashed if not b.ref_cnt)
            if freed:
                gpu.evictions["explicit"] += freed   # cached -> free; in-use blocks stay in use
        except Exception as exc:
            error(COMPONENT, exc)

    def reset_prefix_cache_hook() -> bool:
        hashed = cached = 0
        try:
            # vLLM resets only when every block is free; count the drop before it happens.
            if pool.num_gpu_blocks - pool.get_num_free_blocks() == 1:
                hashed, cached = _walk(pool.blocks)
                inst.hashes_dropped += hashed
                gpu.evictions["reset"] += cached
        except Exception as exc:
            error(COMPONENT, exc)
        done: bool = reset_prefix_cache()
        if not done and (hashed or cached):  # predicted wrongly: take the counts back
            inst.hashes_dropped -= hashed
            gpu.evictions["reset"] -= cached
        return done

    inst.install("get_new_blocks", get_new_blocks_hook)
    inst.install("touch", touch_hook)
    inst.install("cache_full_blocks", cache_full_blocks_hook)
    inst.install("cache_partial_block", cache_partial_block_hook)
    inst.install("move_block_hashes", move_block_hashes_hook)
    inst.install("evict_blocks", evict_blocks_hook)
    inst.install("reset_prefix_cache", reset_prefix_cache_hook)
