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
  tree evicts (``evict``, the allocator's ``evict_for_alloc``), one lookup per request
  the ``PrefillAdder`` admits (GPU and host hit tokens as SGLang splits ``cached_tokens``,
  the prompt's page keys for the reuse profile) and the pages the tree takes past a
  lookup's at ``checkpoint`` (an answer, written in decode) as ``rec.written``;
* :func:`instrument_cache_controller` (:mod:`.host`) second: the host tier (the group's
  anchor pool), backups (gpu->host) and load-backs (host->gpu) with their bytes summed
  over the group's pools, refused backups (drops) and, on a GPU, SGLang's device times.

Each is a declarative :class:`~kvobs.adapters.api.AdapterSpec` table installed by
:func:`~kvobs.adapters.api.instrument` on the instances (never the classes);
``unwrap()`` restores them. A version whose methods differ instruments nothing and logs
one ``kvobs_adapter_unsupported_version`` warning naming what is missing; a failure in
kvobs during an engine call is counted (``kvobs_instrumentation_errors_total``) and the
call goes on. The bare ``RadixCache`` / ``HiCacheController`` / ``HostKVCache`` of
SGLang 0.5.23 are accepted too.

Zero-code: kvobs's SGLang plugin (:mod:`.plugin`, entry point group
``sglang.srt.plugins``, loaded by SGLang in every scheduler process) does all of the
above with one environment variable; each scheduler (TP / PP / DP rank) serves its own
``/metrics`` on ``KVOBS_METRICS_ADDR``'s port plus its rank offset (default
``127.0.0.1:9464``)::

    KVOBS_ENABLE=1 python -m sglang.launch_server --model-path Qwen/Qwen3-8B \\
        --enable-hierarchical-cache

Example (a scheduler you build yourself, once its ``__init__`` returned):
    >>> import kvobs                                                  # doctest: +SKIP
    >>> rec = kvobs.Recorder(engine="sglang", labels={"tp_rank": "0"})  # doctest: +SKIP
    >>> gpu = instrument_token_allocator(scheduler.token_to_kv_pool_allocator, rec,
    ...                                  tree_cache=scheduler.tree_cache)  # doctest: +SKIP
    >>> hicache = instrument_cache_controller(
    ...     scheduler.tree_cache.cache_controller, rec)                     # doctest: +SKIP
    >>> telemetry = kvobs.start_telemetry(rec, metrics_addr="0.0.0.0:9464",
    ...                                   logs=None)                        # doctest: +SKIP
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
