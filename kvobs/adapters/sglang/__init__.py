"""SGLang 0.5.23 -> kvobs tiers: GPU pages and their radix cache, the HiCache host pool.

Where the objects are. SGLang's scheduler process builds its KV stack in
``Scheduler.__init__`` (``kv_cache_builder.build_kv_cache``, then
``create_tree_cache``): ``scheduler.token_to_kv_pool_allocator`` (a
``PagedTokenToKVPoolAllocator`` / ``TokenToKVPoolAllocator``), ``scheduler.tree_cache``
(a ``UnifiedRadixCache``) and, with ``--enable-hierarchical-cache``,
``scheduler.tree_cache.cache_controller`` (a ``HybridCacheController`` over a
``HostPoolGroup``, attached by ``UnifiedRadixCache.init_hicache`` inside
``create_tree_cache``). Instrument them once ``Scheduler.__init__`` returned, in the
scheduler process (one recorder per scheduler / TP rank), before the first request:

* :func:`instrument_token_allocator` (:mod:`.gpu`) with ``tree_cache=``: the GPU tier
  (in use vs cached from ``evictable_size()``), prefix hits, evictions whichever way the
  tree evicts (``evict``, the allocator's ``evict_for_alloc``) and one lookup per request
  the ``PrefillAdder`` admits (GPU and host hit tokens as SGLang splits ``cached_tokens``);
* :func:`instrument_cache_controller` (:mod:`.host`) second: the host tier (the group's
  anchor pool), backups (gpu->host) and load-backs (host->gpu) with their bytes summed
  over the group's pools, refused backups (drops) and, on a GPU, SGLang's device times.

Each is a declarative :class:`~kvobs.adapters._hooks.AdapterSpec` table installed by
:func:`~kvobs.adapters._hooks.instrument` on the instances (never the classes);
``unwrap()`` restores them. A version whose methods differ instruments nothing and logs
one ``kvobs_adapter_unsupported_version`` warning naming what is missing; a failure in
kvobs during an engine call is counted (``kvobs_instrumentation_errors_total``) and the
call goes on. The bare ``RadixCache`` / ``HiCacheController`` / ``HostKVCache`` of
SGLang 0.5.23 are accepted too.

Example: an SGLang plugin (entry point group ``sglang.srt.plugins``, loaded by
``run_scheduler_process`` before the scheduler is built) that instruments every
scheduler once it is built, one recorder and ``/metrics`` port per TP rank::

    import kvobs
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType
    from sglang.srt.runtime_context import get_parallel
    from kvobs.adapters.sglang import instrument_cache_controller, instrument_token_allocator

    def instrument(result, scheduler, *args, **kwargs):
        rank = get_parallel().tp_rank
        rec = kvobs.Recorder(engine="sglang", labels={"tp_rank": str(rank)})
        instrument_token_allocator(scheduler.token_to_kv_pool_allocator, rec,
                                   tree_cache=scheduler.tree_cache)
        if getattr(scheduler.tree_cache, "cache_controller", None) is not None:
            instrument_cache_controller(scheduler.tree_cache.cache_controller, rec)
        kvobs.start_telemetry(rec, metrics_addr=f"0.0.0.0:{9464 + rank}", logs=None)

    def register():              # the entry point
        HookRegistry.register("sglang.srt.managers.scheduler.Scheduler.__init__",
                              instrument, HookType.AFTER)

    >>> gpu = instrument_token_allocator(scheduler.token_to_kv_pool_allocator, rec,
    ...                                  tree_cache=scheduler.tree_cache)  # doctest: +SKIP
    >>> hicache = instrument_cache_controller(
    ...     scheduler.tree_cache.cache_controller, rec)                     # doctest: +SKIP
"""

from kvobs.adapters.sglang.gpu import (
    GpuInstrumentation,
    TreeInstrumentation,
    instrument_token_allocator,
)
from kvobs.adapters.sglang.host import (
    ControllerInstrumentation,
    HostInstrumentation,
    instrument_cache_controller,
    instrument_host_pool,
)

__all__ = [
    "ControllerInstrumentation",
    "GpuInstrumentation",
    "HostInstrumentation",
    "TreeInstrumentation",
    "instrument_cache_controller",
    "instrument_host_pool",
    "instrument_token_allocator",
]
