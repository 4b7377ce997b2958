"""LMCache 0.5.6: the ``LMCacheEngine`` a connector calls, and its CPU backend (host tier).

**Where to call kvobs in a running server.** LMCache's vLLM connector
(``LMCacheConnectorV1``) builds one ``LMCacheEngine`` per *worker* process
(``LMCacheEngineBuilder.get_or_create("vllm-instance", ...)`` in the connector's
``__init__``) and builds its storage (``StorageManager`` -> ``LocalCPUBackend``) in the
engine's ``post_init``, which the connector's ``register_kv_caches`` runs. Lookups reach
that engine too: the scheduler's lookup client sends each request's chunk hashes to the
worker's lookup server, which calls ``engine.lookup(hashes=..., offsets=...,
lookup_id=request_id, pin=True)``. So kvobs is called in the worker, on the engine, any
time after the connector's ``__init__`` (before or after ``register_kv_caches``: the CPU
backend is attached when ``post_init`` builds it), e.g. from a connector subclass loaded
with vLLM's ``kv_connector_module_path``::

    from lmcache.integration.vllm.utils import ENGINE_NAME        # "vllm-instance"
    from lmcache.v1.cache_engine import LMCacheEngineBuilder
    from vllm.distributed.kv_transfer.kv_connector.v1.lmcache_connector import (
        LMCacheConnectorV1)
    from kvobs.adapters.lmcache import instrument_lmcache_engine

    class KvobsLMCacheConnector(LMCacheConnectorV1):
        def register_kv_caches(self, kv_caches):
            super().register_kv_caches(kv_caches)        # LMCache's post_init ran
            engine = LMCacheEngineBuilder.get(ENGINE_NAME)
            if engine is not None:                       # None: LMCache failed to start
                instrument_lmcache_engine(engine, rec)   # rec: this worker's Recorder

(vLLM's ``use_native`` copy of the connector registers its engine under the same name.)
The example is not run here (no vLLM in LMCache's test venv); the engine calls it relies
on are, in ``tests/engines/lmcache056``.

Each tensor-parallel worker has its own engine and answers every lookup: give each its
own recorder (a ``tp_rank`` label), as LMCache's own metrics are per worker.

How LMCache's calls map to the vocabulary (:mod:`kvobs.events`); one host block is one
of LMCache's memory objects: a chunk (``chunk_size`` tokens), or with ``use_layerwise``
one layer of a chunk (below):

=================================  ====================================================
engine call                        events
=================================  ====================================================
``LMCacheEngine.lookup``           one ``rec.lookup`` per call: ``len(tokens)`` or
                                   ``sum(offsets)`` tokens (what LMCache counts), hit
                                   tokens = its result: ``host_hit`` for the chunks the
                                   ``LocalCPUBackend`` holds, ``disk_hit`` for the rest
                                   (a later backend: disk, remote); keys: the
                                   chunk hashes it probed (reuse profile)
``LMCacheEngine.post_init``        instruments the ``LocalCPUBackend`` it built
GPU connector                      gpu->host ``transfer(chunks, bytes)`` of the chunks
``batched_from_gpu`` (``store``)   copied (a chunk whose key is cached already is
                                   copied too, then dropped: it lands nothing)
GPU connector ``batched_to_gpu``   host->gpu ``transfer(chunks, bytes)`` (``retrieve``)
backend ``allocate`` -> None       gpu->host ``drop(n)``: n = the call's non-empty
inside an ``LMCacheEngine.store``  chunks (LMCache's ``token_database.process_tokens``
of this thread                     of its arguments) less those it allocated before
                                   (its ``memory_objs``, read in the call; no hook on
                                   ``store``); a store that allocated every chunk, or
                                   that LMCache skipped, drops nothing
stats monitor                      seconds: LMCache's ``from_gpu_time`` /
``on_store_finished`` /            ``to_gpu_time`` around those copies (its timing;
``on_retrieve_finished``           kvobs measures none)
backend ``allocate`` (not None)    ``allocate(1)``; ``batched_allocate``: ``allocate(n)``
backend ``allocate`` -> None       nothing on the tier; noted (per thread) for a
                                   ``store`` (above) or ``store_layer`` (below)
backend ``submit_put_task``        ``store(1, keys)``: the written chunk lands in the
new key                            cache (in use -> cached; the free is derived, below);
                                   a known key: nothing (LMCache keeps the old chunk;
                                   the new one is freed when the writer drops it); a
                                   new chunk no recent lookup asked for (an
                                   answer's, ``save_decode_cache``) is also
                                   ``rec.written((chunk_hash,))``
collection (no free is hooked)     frees, from LMCache's live memory objects:
                                   ``free(cached=True)`` up to the reuses (a chunk
                                   stays cached while read), ``free`` up to allocations
                                   less in use (a written chunk landing, a duplicate or
                                   an evicted chunk its last holder dropped)
backend ``get_blocking`` hit       ``reuse(1, keys)``: a host hit, an onload; the chunk
(``retrieve``)                     stays cached while read.
                                   ``batched_get_non_blocking``: per chunk
backend ``batched_contains``       nothing counted: the chunks found, read by the
                                   engine's ``lookup`` hook (host / disk split)
backend ``remove`` that removed    ``evict(1, reason, keys)``: ``capacity`` inside
                                   ``allocate`` (LRU, ``force=False``), ``explicit``
                                   otherwise, ``reset`` inside ``clear``; a chunk a
                                   reader still holds stays allocated: ``allocate(1)``,
                                   freed by the reader's last drop
allocator ``batched_free`` of      ``evict(n, "capacity", keys)`` (``batched_allocate``
cached chunks                      on a ``MixedMemoryAllocator`` pops the hot cache
                                   itself)
=================================  ====================================================

Occupancy is read from the backend at collection (cached = its ``hot_cache``, in use =
the other live allocations of its CPU buffer); capacity = the buffer's bytes over an
object's aligned size, which is also a block's bytes (what LMCache's usage counts). A
kvobs failure inside any of these calls is counted
(``kvobs_instrumentation_errors_total{component="lmcache.engine"|...}``) and the engine
call goes on; an LMCache version whose objects differ is left alone with one warning
naming what is missing (a connector or backend of another kind likewise, the rest still
counts). Store drops are counted where LMCache allocates in the ``LocalCPUBackend``
kvobs instruments (not with ``enable_pd``, whose ``PDBackend`` allocates) and its
``store`` / ``store_layer`` keep the locals kvobs reads there on a refusal (one warning
where not); a layerwise ``store_layer`` that finds no room counts the layer objects of
every chunk from the refused one on that no backend holds (LMCache stops there and skips
the chunks it holds; asked of its local backends only, so not with a remote one, which
one warning says). Not covered: ``enable_async_loading`` (lookups go through
``async_lookup_and_prefetch``, which LMCache's own lookup counters skip too). With
``use_layerwise`` LMCache keeps a chunk as ``num_layers`` memory objects, one per layer,
under per-layer keys: allocated together (``batched_allocate``), put one layer per step of
``store_layer``, evicted together by ``batched_allocate`` but one by one by ``allocate``,
``remove`` and ``clear``. So a host block stays one object (every event above holds as
it is) worth ``chunk_size / num_layers`` of the model's tokens: capacity, occupancy and
flows in tokens and bytes are what LMCache's memory holds. Where that share is no whole
number the tier's ``block_tokens`` is 0 and its token figures are left out (no token
series, ``None`` in the capacity event), never rounded. The reuse profile counts chunks
there (a lookup's chunks as LMCache chunks its arguments, a stored chunk written once, by
its first layer; the profile's size the host tier's blocks over the layers), and one
warning says what the blocks are and what is not counted. The layerwise connector's
copies are generators that ``store_layer`` / ``retrieve_layer`` step once per layer: each
step is counted as it returns, one transfer of that layer's objects
(:class:`~.engine.LayerCopies`), with no seconds, since LMCache times no layerwise copy;
so the host pool's onload cost is unknown there, and its net benefit is not exported
(onloads without seconds are never taken as free).

Supported: LMCache 0.5.6 (``lmcache.v1``), the engine on CPU or GPU.
"""

from kvobs.adapters.lmcache.backend import (
    ALLOCATOR_COMPONENT,
    ALLOCATOR_SPEC,
    COMPONENT,
    SPEC,
    LMCacheInstrumentation,
    instrument_local_cpu_backend,
)
from kvobs.adapters.lmcache.engine import (
    LMCacheEngineInstrumentation,
    instrument_lmcache_engine,
)

__all__ = [
    "ALLOCATOR_COMPONENT",
    "ALLOCATOR_SPEC",
    "COMPONENT",
    "SPEC",
    "LMCacheEngineInstrumentation",
    "LMCacheInstrumentation",
    "instrument_lmcache_engine",
    "instrument_local_cpu_backend",
]
