"""SGLang 0.5.23 -> kvobs tiers: GPU pages and their radix cache, the HiCache host pool.

* :func:`instrument_token_allocator` (:mod:`.gpu`): the GPU tier, from the scheduler's
  ``token_to_kv_pool_allocator``; pass ``tree_cache`` (the ``RadixCache``) for cached vs
  in use (``evictable_size()``), prefix hits, evictions and per-request lookups.
* :func:`instrument_host_pool` (:mod:`.host`): the host tier, from a ``HostKVCache``.
* :func:`instrument_cache_controller` (:mod:`.host`): HiCache's gpu->host offloads
  (``write``) and host->gpu onloads (``load``), with its host pool.

Each is a declarative :class:`~kvobs.adapters._hooks.AdapterSpec` table installed by
:func:`~kvobs.adapters._hooks.instrument`; ``unwrap()`` restores the engine objects.

Example:
    >>> from kvobs.adapters.sglang import instrument_token_allocator, instrument_host_pool
    >>> gpu = instrument_token_allocator(scheduler.token_to_kv_pool_allocator, rec,
    ...                                  tree_cache=scheduler.tree_cache)  # doctest: +SKIP
    >>> hicache = instrument_cache_controller(tree.cache_controller, rec)  # doctest: +SKIP
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
