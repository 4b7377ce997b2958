"""SGLang 0.5.23 GPU tier: the token/page allocator and the radix cache over it.

A kvobs block is one SGLang *page* (``page_size`` tokens; 1 for the token allocator).
The engine's own account, which kvobs mirrors: **resident** pages = ``size -
available_size()``; **cached** = the radix cache's ``evictable_size()`` (in the tree, no
request holds them); **in use** = resident - cached (running requests' pages, locked
tree pages included: ``protected_size()``).

Events are read as *changes* of those engine numbers after each hooked call (a
"settle"), so nested engine calls, deferred frees (``free_group_begin``/``end``) and
every allocation path count once and exactly:

=====================================  ===============================================
engine change                          events
=====================================  ===============================================
``available_size()`` falls by n pages  ``allocate(n)``
``available_size()`` rises by n pages  ``free(n)`` (in use -> free), except inside
                                       ``RadixCache.evict`` (counted as the eviction)
``evictable_size()`` rises by n pages  ``free(n, cached=True)``: a request's pages
                                       inserted or unlocked, kept for reuse
``evictable_size()`` falls by n pages  ``reuse(n)``: a prefix hit locks cached pages
``RadixCache.evict``                   ``evict(n, "capacity")``
``RadixCache.reset``                   ``evict(cached, "reset")``; the allocator's
                                       ``clear`` then frees the rest
``match_prefix(params)`` for a request ``rec.lookup(len(key), gpu_hit=device_prefix_len,
(``params.req`` set)                   host_hit=host_hit_length)``
=====================================  ===============================================

Occupancy is read from the engine at collection, after a last settle, so the flows
identity holds exactly at every snapshot (``kvobs.testing`` checks it). Between a
tree's ``reset`` and the allocator's ``clear`` (one ``flush_cache``) the flows lag the
engine by the reset pages.

Example:
    >>> inst = instrument_token_allocator(allocator, rec, tree_cache=tree)  # doctest: +SKIP
    >>> rec.snapshot().tier("gpu").cached_blocks                            # doctest: +SKIP
    0
"""

from __future__ import annotations

from typing import Any

from kvobs.adapters._hooks import (
    MARKER,
    AdapterError,
    AdapterSpec,
    Hook,
    Instrumentation,
    class_names,
    instrument,
)
from kvobs.recorder import Recorder, TierRecorder
from kvobs.tiers import GPU

ALLOCATOR_COMPONENT = "sglang.token_allocator"
TREE_COMPONENT = "sglang.radix_cache"


class GpuInstrumentation(Instrumentation):
    """Wrappers on one SGLang token allocator (and its radix cache); counts in pages."""

    def __init__(self, allocator: Any, rec: Recorder | None, tier: TierRecorder,
                 active: bool) -> None:
        super().__init__(allocator, ALLOCATOR_COMPONENT, active, rec, tier)
        self.page = int(getattr(allocator, "page_size", 1) or 1)
        self.free_pages = 0 if not active else int(allocator.available_size()) // self.page
        self.tree_cache: Any = None
        self.cached_pages = 0      # evictable pages last seen in the tree
        self.evicting = False      # inside RadixCache.evict: freed pages are its eviction
        self.orphaned = 0          # pages a tree reset evicted, not yet back in the free list

    def settle_pool(self) -> None:
        """Count what changed in the allocator since the last settle."""
        now = int(self.target.available_size()) // self.page
        taken, self.free_pages = self.free_pages - now, now
        if taken > 0:
            self.tier.allocate(taken)
        elif taken < 0 and not self.evicting:
            freed = -taken
            absorbed = min(freed, self.orphaned)
            self.orphaned -= absorbed
            if freed > absorbed:
                self.tier.free(freed - absorbed)

    def settle(self) -> None:
        """Count what changed in the allocator and the tree since the last settle."""
        self.settle_pool()
        tree = self.tree_cache
        if tree is not None:
            cached = int(tree.evictable_size()) // self.page
            grown, self.cached_pages = cached - self.cached_pages, cached
            if grown > 0:
                self.tier.free(grown, cached=True)
            elif grown < 0:
                self.tier.reuse(-grown)

    def resident(self) -> tuple[int, int]:
        """``(in_use, cached)`` pages read from the engine (after a last settle)."""
        self.settle()
        allocator = self.target
        resident = (int(allocator.size) - int(allocator.available_size())) // self.page
        cached = 0
        if self.tree_cache is not None:
            cached = min(int(self.tree_cache.evictable_size()) // self.page, resident)
        return resident - cached, cached


class TreeInstrumentation(Instrumentation):
    """Wrappers on one ``RadixCache``; its events go to the allocator's tier."""

    def __init__(self, tree: Any, gpu: GpuInstrumentation, active: bool) -> None:
        super().__init__(tree, TREE_COMPONENT, active, gpu.rec, gpu.tier)
        self.gpu = gpu


def _settle(inst: GpuInstrumentation, state: None, result: Any, *args: Any,
            **kwargs: Any) -> None:
    inst.settle_pool()     # tree changes settle in the tree's hooks and at collection


def _settle_tree(inst: TreeInstrumentation, state: None, result: Any, *args: Any,
                 **kwargs: Any) -> None:
    inst.gpu.settle()


def _matched(inst: TreeInstrumentation, state: None, result: Any, params: Any,
             *args: Any, **kwargs: Any) -> None:
    if getattr(params, "req", None) is not None:   # the scheduler's per-request lookup
        inst.rec.lookup(len(params.key), gpu_hit=int(result.device_prefix_len),
                        host_hit=int(getattr(result, "host_hit_length", 0) or 0))


def _evicting(inst: TreeInstrumentation, *args: Any, **kwargs: Any) -> None:
    inst.gpu.settle()
    inst.gpu.evicting = True


def _evicted(inst: TreeInstrumentation, state: None, result: Any, *args: Any,
             **kwargs: Any) -> None:
    gpu = inst.gpu
    gpu.settle_pool()            # the freed pages: absorbed, they are the eviction
    gpu.evicting = False
    pages = int(result.num_tokens_evicted) // gpu.page
    if pages:
        gpu.tier.evict(pages, "capacity")
        gpu.cached_pages -= pages
    gpu.settle()


def _resetting(inst: TreeInstrumentation, *args: Any, **kwargs: Any) -> None:
    inst.gpu.settle()


def _was_reset(inst: TreeInstrumentation, state: None, result: Any) -> None:
    gpu = inst.gpu
    if gpu.cached_pages:
        gpu.tier.evict(gpu.cached_pages, "reset")
        gpu.orphaned += gpu.cached_pages   # still allocated until the allocator's clear
        gpu.cached_pages = 0
    gpu.settle()


_ALLOCATOR_PATHS = ("alloc_extend", "alloc_decode", "free_segment", "free_page_ids",
                    "free_full", "free_group_end", "clear")
ALLOCATOR_SPEC = AdapterSpec(ALLOCATOR_COMPONENT, ("BaseTokenToKVPoolAllocator",), (
    Hook("alloc", ("need_size",), "allocate", after=_settle),
    Hook("free", ("free_index",), "free", after=_settle),
    *(Hook(name, (), "allocate, free", after=_settle, optional=True)
      for name in _ALLOCATOR_PATHS),
), state=("size", "page_size", "available_size"))

_TREE_MUTATORS = ("insert", "inc_lock_ref", "dec_lock_ref", "checkpoint",
                  "cache_finished_req", "cache_unfinished_req")
TREE_SPEC = AdapterSpec(TREE_COMPONENT, ("BasePrefixCache",), (
    Hook("match_prefix", ("params",), "lookup", after=_matched),
    Hook("evict", ("params",), "evict", before=_evicting, after=_evicted),
    Hook("reset", (), "evict", before=_resetting, after=_was_reset),
    *(Hook(name, (), "free, reuse", after=_settle_tree, optional=True)
      for name in _TREE_MUTATORS),
), state=("evictable_size", "protected_size"))


def instrument_token_allocator(allocator: Any, rec: Recorder, *, tier: str = GPU,
                               tree_cache: Any = None,
                               block_bytes: int = 0) -> GpuInstrumentation:
    """Count an SGLang token/page allocator (and its radix cache) as tier ``tier``.

    Args:
        allocator: the scheduler's ``token_to_kv_pool_allocator``.
        rec: the recorder.
        tree_cache: the scheduler's ``tree_cache`` (``RadixCache``); with it kvobs tells
            cached pages from pages in use, counts prefix hits (reuses), evictions and
            per-request lookups. Without it every resident page reads as in use.
        block_bytes: bytes per page across layers (0 if unknown).

    Returns:
        The instrumentation; ``unwrap()`` restores the allocator and the tree.

    Raises:
        AdapterError: not a token allocator (or ``tree_cache`` not a prefix cache), or
            already instrumented.

    Example:
        >>> inst = instrument_token_allocator(allocator, rec, tree_cache=tree)  # doctest: +SKIP
        >>> inst.unwrap()                                                       # doctest: +SKIP
    """
    def make(active: bool) -> GpuInstrumentation:
        page = int(getattr(allocator, "page_size", 1) or 1)
        pages = int(getattr(allocator, "size", 0)) // page
        add = rec.add_tier if active else TierRecorder   # an unknown version exports nothing
        return GpuInstrumentation(allocator, rec, add(tier, pages, page, block_bytes), active)

    if tree_cache is not None and (not class_names(tree_cache) & set(TREE_SPEC.kinds) or
                                   getattr(tree_cache, MARKER, None) is not None):
        raise AdapterError(f"{TREE_COMPONENT}: tree_cache must be the scheduler's own "
                           f"BasePrefixCache, not yet instrumented; got "
                           f"{type(tree_cache).__qualname__}")
    inst = instrument(allocator, ALLOCATOR_SPEC, make)
    if not inst.active:
        return inst
    if tree_cache is not None:
        tree = instrument(tree_cache, TREE_SPEC,
                          lambda active: TreeInstrumentation(tree_cache, inst, active))
        if tree.active:
            inst.tree_cache = tree_cache
            inst.cached_pages = int(tree_cache.evictable_size()) // inst.page
            inst.on_unwrap(tree.unwrap)
    inst.tier.set_resident_source(inst.resident)
    inst.on_unwrap(lambda: inst.tier.set_resident_source(None))
    return inst
