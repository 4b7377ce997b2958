"""SGLang 0.5.23 KV pools -> kvobs tiers: the GPU token allocator and the HiCache host pool.

A kvobs block is one SGLang *page* (``page_size`` tokens; 1 for the token allocator).

GPU (``TokenToKVPoolAllocator``, ``PagedTokenToKVPoolAllocator`` and other
``BaseTokenToKVPoolAllocator`` subclasses): every allocation path (``alloc``,
``alloc_extend``, ``alloc_decode``) and ``free`` is counted by the change it makes to
``available_size()``, so deferred frees (``free_group_begin``/``end``) count when they
land. SGLang's allocator does not know which allocated pages the radix cache keeps only
for reuse; pass ``tree_cache`` (the ``RadixCache``) to split resident pages into in use
and cached by its ``evictable_size()``, otherwise all resident pages read as in use.

Host (``HostKVCache`` subclasses such as ``MHATokenToKVPoolHost``): ``alloc`` reserves
pages for KV backed up from the GPU (counted as stored: they hold reusable KV), a
``None`` from ``alloc`` is a GPU->host drop (the host pool is full), ``free`` is an
eviction (reason ``other``: the pool is not told why; HiRadixCache eviction is the usual
caller), ``clear`` drops everything (``reset``).

Example:
    >>> inst = instrument_token_allocator(allocator, rec, tree_cache=tree_cache)  # doctest: +SKIP
    >>> inst = instrument_host_pool(host_pool, rec)                               # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

from kvobs.adapters._hooks import Hook, Instrumentation, begin
from kvobs.recorder import Recorder, TierRecorder
from kvobs.tiers import GPU, HOST

GPU_COMPONENT = "sglang.token_allocator"
HOST_COMPONENT = "sglang.host_pool"
GPU_HOOKS = (Hook("alloc", ("need_size",)), Hook("free", ("free_index",)),
             Hook("available_size", ()), Hook("clear", ()))
GPU_STATE = ("size", "page_size")
HOST_HOOKS = (Hook("alloc", ("need_size",)), Hook("free", ("indices",)),
              Hook("available_size", ()), Hook("clear", ()))
HOST_STATE = ("size", "page_size", "size_per_token")


class SGLangInstrumentation(Instrumentation):
    """Wrappers on one SGLang pool; ``tier`` counts in pages."""

    def __init__(self, target: Any, component: str, tier: TierRecorder, active: bool) -> None:
        super().__init__(target, component, active)
        self.tier = tier
        self.tree_cache: Any = None

    def gpu_resident(self) -> tuple[int, int]:
        """``(in_use, cached)`` pages of a token allocator (cached needs the tree cache)."""
        pool = self.target
        page = pool.page_size
        resident = (pool.size - pool.available_size()) // page
        cached = 0
        if self.tree_cache is not None:
            cached = min(int(self.tree_cache.evictable_size()) // page, resident)
        return resident - cached, cached

    def host_resident(self) -> tuple[int, int]:
        """``(in_use, cached)`` pages of a host pool: every reserved page holds KV."""
        pool = self.target
        return 0, (pool.size - pool.available_size()) // pool.page_size


def instrument_token_allocator(allocator: Any, rec: Recorder, *, tier: str = GPU,
                               tree_cache: Any = None,
                               block_bytes: int = 0) -> SGLangInstrumentation:
    """Count an SGLang token/page allocator as tier ``tier`` of ``rec``.

    Args:
        allocator: the scheduler's ``token_to_kv_pool_allocator``.
        rec: the recorder.
        tree_cache: the ``RadixCache`` (optional) to tell cached pages from pages in use.
        block_bytes: bytes per page across layers (0 if unknown).

    Raises:
        AdapterError: not a token allocator, or already instrumented.
    """
    def make(active: bool) -> SGLangInstrumentation:
        page = int(getattr(allocator, "page_size", 1) or 1)
        pages = int(getattr(allocator, "size", 0)) // page
        add = rec.add_tier if active else TierRecorder
        return SGLangInstrumentation(allocator, GPU_COMPONENT,
                                     add(tier, pages, page, block_bytes), active)

    inst = begin(allocator, ("BaseTokenToKVPoolAllocator",), GPU_HOOKS, GPU_COMPONENT, make,
                 GPU_STATE)
    if inst.active:
        inst.tree_cache = tree_cache
        for name in ("alloc", "alloc_extend", "alloc_decode"):
            if _overridden(allocator, name):
                inst.install(name, _counting(inst, rec, getattr(allocator, name), allocate=True))
        inst.install("free", _counting(inst, rec, allocator.free, allocate=False))
        inst.tier.set_resident_source(inst.gpu_resident)
        inst.on_unwrap(lambda: inst.tier.set_resident_source(None))
    return inst


def _overridden(allocator: Any, name: str) -> bool:
    """Whether ``name`` is a real allocation path here (the base class only raises)."""
    method = getattr(type(allocator), name, None)
    for cls in type(allocator).__mro__:
        if name in vars(cls):
            return cls.__name__ != "BaseTokenToKVPoolAllocator" and callable(method)
    return False


def _counting(inst: SGLangInstrumentation, rec: Recorder, original: Any,
              allocate: bool) -> Any:
    pool, tier, error = inst.target, inst.tier, rec.error

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            before = pool.available_size()
        except Exception as exc:
            error(GPU_COMPONENT, exc)
            before = None
        result = original(*args, **kwargs)
        try:
            if before is not None:
                change = (before - pool.available_size()) // pool.page_size
                if allocate and change > 0:
                    tier.allocated(change)
                elif not allocate and change < 0:
                    tier.freed(-change)
        except Exception as exc:
            error(GPU_COMPONENT, exc)
        return result

    wrapper.__name__ = getattr(original, "__name__", "wrapper")
    return wrapper


def instrument_host_pool(host_pool: Any, rec: Recorder, *, tier: str = HOST,
                         gpu_tier: str = GPU) -> SGLangInstrumentation:
    """Count an SGLang HiCache host pool (``HostKVCache``) as tier ``tier`` of ``rec``.

    Raises:
        AdapterError: not a host pool, or already instrumented.
    """
    def make(active: bool) -> SGLangInstrumentation:
        page = int(getattr(host_pool, "page_size", 1) or 1)
        pages = int(getattr(host_pool, "size", 0)) // page
        page_bytes = page * int(getattr(host_pool, "size_per_token", 0))
        add = rec.add_tier if active else TierRecorder
        return SGLangInstrumentation(host_pool, HOST_COMPONENT,
                                     add(tier, pages, page, page_bytes), active)

    inst = begin(host_pool, ("HostKVCache",), HOST_HOOKS, HOST_COMPONENT, make, HOST_STATE)
    if not inst.active:
        return inst
    host, error, offload = inst.tier, rec.error, rec.link(gpu_tier, tier)
    alloc, free, clear = host_pool.alloc, host_pool.free, host_pool.clear

    def alloc_hook(need_size: int) -> Any:
        indices = alloc(need_size)
        try:
            pages = need_size // host_pool.page_size
            if indices is None:
                offload.dropped(pages)
            else:
                host.stored(pages)
        except Exception as exc:
            error(HOST_COMPONENT, exc)
        return indices

    def free_hook(indices: Any) -> Any:
        freed = free(indices)
        try:
            if freed:
                host.evicted(int(freed) // host_pool.page_size, "other")
        except Exception as exc:
            error(HOST_COMPONENT, exc)
        return freed

    def clear_hook() -> Any:
        try:
            _, cached = inst.host_resident()
        except Exception as exc:
            error(HOST_COMPONENT, exc)
            cached = 0
        result = clear()
        if cached:
            host.evicted(cached, "reset")
        return result

    inst.install("alloc", alloc_hook)
    inst.install("free", free_hook)
    inst.install("clear", clear_hook)
    inst.tier.set_resident_source(inst.host_resident)
    inst.on_unwrap(lambda: inst.tier.set_resident_source(None))
    return inst
