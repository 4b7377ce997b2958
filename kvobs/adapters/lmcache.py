"""LMCache 0.5.6 ``LocalCPUBackend`` -> the host tier.

One host block is one LMCache *chunk* (a ``MemoryObj`` of ``chunk_size`` tokens).

* ``allocate`` / ``batched_allocate`` -> chunks taken from the CPU buffer (free -> in use);
* ``submit_put_task`` that stores a new key -> the chunk becomes cached (an offload,
  for thrash tracking); a duplicate put stores nothing;
* ``contains`` / ``batched_async_contains`` -> per-chunk lookups and hits;
* ``get_blocking`` / ``batched_get_non_blocking`` hits -> reuses (an onload);
* ``remove(force=False)`` -> capacity eviction (what ``allocate`` does when the buffer
  is full), ``remove(force=True)`` -> explicit, removals inside ``clear`` -> reset.

Occupancy is read from the backend at collection: cached = chunks in its hot cache,
in use = live allocations of its memory allocator not (yet) in the hot cache.

Example:
    >>> backend = LocalCPUBackend(config, metadata)                # doctest: +SKIP
    >>> inst = instrument_local_cpu_backend(backend, rec, block_tokens=256,
    ...                                     block_bytes=backend.get_full_chunk_size_bytes())
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvobs.adapters._hooks import Hook, Instrumentation, begin
from kvobs.errors import ConfigError
from kvobs.recorder import Recorder, TierRecorder
from kvobs.tiers import HOST

COMPONENT = "lmcache.local_cpu_backend"
HOOKS = (
    Hook("allocate", ("shapes", "dtypes", "fmt", "eviction", "busy_loop")),
    Hook("batched_allocate", ("shapes", "dtypes", "batch_size")),
    Hook("submit_put_task", ("key", "memory_obj")),
    Hook("contains", ("key", "pin")),
    Hook("batched_async_contains", ("lookup_id", "keys", "pin")),
    Hook("get_blocking", ("key",)),
    Hook("batched_get_non_blocking", ("lookup_id", "keys")),
    Hook("remove", ("key", "force")),
    Hook("clear", ()),
)
STATE = ("hot_cache", "memory_allocator", "cpu_lock")


class LMCacheInstrumentation(Instrumentation):
    """Wrappers on one ``LocalCPUBackend``, with per-chunk lookup tallies."""

    def __init__(self, backend: Any, tier: TierRecorder, active: bool) -> None:
        super().__init__(backend, COMPONENT, active)
        self.tier = tier
        self.lookups = 0       # chunks looked up
        self.lookup_hits = 0   # of them present
        self.removal_reason: str | None = None

    def resident(self) -> tuple[int, int]:
        """``(in_use, cached)`` chunks read from the backend."""
        backend = self.target
        cached = len(backend.hot_cache)
        live = getattr(_buffer_allocator(backend), "num_active_allocations", None)
        in_use = max(int(live) - cached, 0) if isinstance(live, int) else 0
        return in_use, cached


def instrument_local_cpu_backend(backend: Any, rec: Recorder, *, block_tokens: int,
                                 block_bytes: int, capacity_blocks: int | None = None,
                                 tier: str = HOST) -> LMCacheInstrumentation:
    """Count an LMCache ``LocalCPUBackend`` as tier ``tier`` of ``rec``.

    Args:
        backend: the engine's ``LocalCPUBackend``.
        rec: the recorder.
        block_tokens: tokens per chunk (LMCache ``chunk_size``).
        block_bytes: bytes per full chunk (``backend.get_full_chunk_size_bytes()``).
        capacity_blocks: chunks the CPU buffer holds; default: the allocator's buffer
            bytes (or ``max_local_cpu_size``) divided by ``block_bytes``.

    Raises:
        AdapterError: not a LocalCPUBackend, or already instrumented.
        ConfigError: ``block_bytes`` is not positive.
    """
    def make(active: bool) -> LMCacheInstrumentation:
        capacity = capacity_blocks if capacity_blocks is not None else \
            _capacity(backend, block_bytes)
        add = rec.add_tier if active else TierRecorder  # an unknown backend exports nothing
        return LMCacheInstrumentation(
            backend, add(tier, capacity, block_tokens, block_bytes), active)

    inst = begin(backend, ("LocalCPUBackend",), HOOKS, COMPONENT, make, STATE)
    if inst.active:
        _install(inst, backend, rec)
        inst.tier.set_resident_source(inst.resident)
        inst.on_unwrap(lambda: inst.tier.set_resident_source(None))
    return inst


def _capacity(backend: Any, block_bytes: int) -> int:
    if isinstance(block_bytes, bool) or not isinstance(block_bytes, int) or block_bytes <= 0:
        raise ConfigError(f"lmcache: block_bytes must be a positive integer, got "
                          f"{block_bytes!r}: pass backend.get_full_chunk_size_bytes()")
    buffer = getattr(_buffer_allocator(backend), "buffer", None)
    total = buffer.numel() * buffer.element_size() if buffer is not None else \
        int(float(getattr(backend.config, "max_local_cpu_size", 0)) * 1024**3)
    return total // block_bytes


def _buffer_allocator(backend: Any) -> Any:
    """The allocator owning the CPU buffer (``MixedMemoryAllocator`` keeps it in
    ``pin_allocator``)."""
    allocator = backend.memory_allocator
    return getattr(allocator, "pin_allocator", allocator)


def _install(inst: LMCacheInstrumentation, backend: Any, rec: Recorder) -> None:
    host, thrash, error = inst.tier, rec.thrash, rec.error
    hot_cache = backend.hot_cache
    allocate, batched_allocate = backend.allocate, backend.batched_allocate
    submit_put_task, contains = backend.submit_put_task, backend.contains
    batched_async_contains = backend.batched_async_contains
    get_blocking, batched_get = backend.get_blocking, backend.batched_get_non_blocking
    remove, clear = backend.remove, backend.clear

    def allocate_hook(*args: Any, **kwargs: Any) -> Any:
        obj = allocate(*args, **kwargs)
        try:
            if obj is not None:
                host.allocations += 1
        except Exception as exc:
            error(COMPONENT, exc)
        return obj

    def batched_allocate_hook(*args: Any, **kwargs: Any) -> Any:
        objs = batched_allocate(*args, **kwargs)
        try:
            host.allocations += len(objs) if objs else 0
        except Exception as exc:
            error(COMPONENT, exc)
        return objs

    def submit_put_task_hook(key: Any, memory_obj: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            new = key not in hot_cache
        except Exception as exc:
            error(COMPONENT, exc)
            new = False
        result = submit_put_task(key, memory_obj, *args, **kwargs)
        try:
            if new and key in hot_cache:
                host.freed(1, cached=True)   # written: in use -> cached
                thrash.offloaded((key,))
        except Exception as exc:
            error(COMPONENT, exc)
        return result

    def contains_hook(key: Any, pin: bool = False) -> bool:
        found: bool = contains(key, pin)
        inst.lookups += 1
        inst.lookup_hits += found
        return found

    async def batched_async_contains_hook(lookup_id: str, keys: Sequence[Any],
                                          pin: bool = False) -> int:
        hits: int = await batched_async_contains(lookup_id, keys, pin)
        try:
            inst.lookups += min(hits + 1, len(keys))  # it stops at the first miss
            inst.lookup_hits += hits
        except Exception as exc:
            error(COMPONENT, exc)
        return hits

    def get_blocking_hook(key: Any) -> Any:
        obj = get_blocking(key)
        if obj is not None:
            try:
                host.reuses += 1
                thrash.onloaded((key,))
            except Exception as exc:
                error(COMPONENT, exc)
        return obj

    async def batched_get_hook(lookup_id: str, keys: list[Any], *args: Any,
                               **kwargs: Any) -> Any:
        objs = await batched_get(lookup_id, keys, *args, **kwargs)
        try:
            host.reuses += len(objs)
            thrash.onloaded(keys[: len(objs)])
        except Exception as exc:
            error(COMPONENT, exc)
        return objs

    def remove_hook(key: Any, force: bool = True) -> bool:
        removed: bool = remove(key, force)
        if removed:
            try:
                reason = inst.removal_reason or ("explicit" if force else "capacity")
                host.evicted(1, reason)
                thrash.evicted((key,))
            except Exception as exc:
                error(COMPONENT, exc)
        return removed

    def clear_hook() -> int:
        inst.removal_reason = "reset"
        try:
            cleared: int = clear()
        finally:
            inst.removal_reason = None
        return cleared

    inst.install("allocate", allocate_hook)
    inst.install("batched_allocate", batched_allocate_hook)
    inst.install("submit_put_task", submit_put_task_hook)
    inst.install("contains", contains_hook)
    inst.install("batched_async_contains", batched_async_contains_hook)
    inst.install("get_blocking", get_blocking_hook)
    inst.install("batched_get_non_blocking", batched_get_hook)
    inst.install("remove", remove_hook)
    inst.install("clear", clear_hook)
