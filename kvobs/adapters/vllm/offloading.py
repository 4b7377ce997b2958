"""vLLM 0.33 ``CPUOffloadingManager`` (scheduler side of CPU offloading) -> the host tier.

One host block is one offloading *chunk* (``blocks_per_chunk`` GPU blocks). Mapping onto
the vocabulary of :mod:`kvobs.events`:

* ``prepare_store`` -> ``allocate`` the chunks about to be written (free -> in use);
  ``evicted_keys`` -> ``evict`` (capacity, keyed: thrash sees offloads evicted unused);
  ``None`` (the tier is full of chunks being read or written) -> ``drop`` on the
  gpu->host link, each distinct chunk once however often vLLM re-offers it (a bounded
  set of refused keys; a key is forgotten once it is stored);
* ``complete_store`` -> the written chunks (the drop of vLLM's own
  ``_num_write_pending_chunks`` over the call) leave "in use" (``free``) and land as cached
  data (``store``, keyed); a failed store only frees them and counts a ``fail`` on the
  link. vLLM's offloading connector calls it once per store job it completes, so with
  the connector instrumented (``store_jobs``) each call is also one ``transfer`` of the
  job's chunks on the gpu->host link: host stores equal gpu->host transfer chunks (the
  bytes and seconds come from :mod:`kvobs.adapters.vllm.connector`);
* ``prepare_load`` -> ``reuse`` of the idle chunks (the drop of vLLM's
  ``_num_evictable_cache_chunks`` over the call: a host hit, cached -> in use; keyed:
  an onload for thrash) and the request's host hits for the lookup adapter;
  ``complete_load`` -> the last reader's ``free(cached=True)``, and (``load_jobs``) one
  ``transfer`` of the job's chunks on the host->gpu link;
* ``reset_cache`` -> chunks in use freed, cached ones evicted (reason ``reset``).

With vLLM's tiering the manager is the ``CPUPrimaryTierOffloadingManager``, which binds
``prepare_write`` / ``complete_write`` / ``complete_read`` to the original store / load
methods in its ``__init__`` and reads for cascades with ``prepare_read``; those are
wrapped too (optional hooks): ``prepare_write`` (a promotion from disk reserving chunks)
-> ``allocate`` / ``evict`` (capacity); ``complete_write`` -> ``free(cached=True)``
(``free`` when the promotion failed); ``prepare_read`` (a cascade pinning chunks) ->
``reuse`` of the idle ones, unkeyed; ``complete_read`` -> the last reader's
``free(cached=True)``. Promotions are not ``store``: host stores stay equal to the
gpu->host transfer chunks.

Occupancy is read from the manager at collection: resident = allocated chunks (in use =
being written or read, cached = readable and evictable). This is the figure vLLM's own
``kv_offload`` usage gauge misses: a full but idle CPU tier reads 100% resident here.

Example (needs vLLM)::

    from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager
    manager = CPUOffloadingManager(num_chunks=1024, cache_policy="arc")
    inst = instrument_offloading_manager(manager, rec, block_tokens=64, block_bytes=8 << 20)
    rec.snapshot().tier("host").capacity_blocks     # 1024
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Iterable
from typing import Any

from kvobs.adapters.api import AdapterSpec, Hook, Instrumentation, attr_path, instrument
from kvobs.adapters.vllm.lookups import HostHits
from kvobs.events import NULL_LINK, LinkEvents
from kvobs.recorder import Recorder, TierRecorder
from kvobs.tiers import GPU, HOST

COMPONENT = "vllm.cpu_offloading_manager"
#: Refused chunk keys remembered so that a re-offer is not counted as a new drop.
MAX_REFUSED_KEYS = 65536


class OffloadingInstrumentation(Instrumentation):
    """Wrappers on one offloading manager.

    Per-key ``lookup`` calls are not wrapped (the scheduler makes one per chunk of every
    prompt; host hits are read where vLLM pins them, in ``prepare_load``).

    ``offload`` is the gpu->host link (drops and failures); ``refused`` the chunk keys
    refused and not stored since (oldest forgotten first beyond ``MAX_REFUSED_KEYS``).
    ``store_jobs`` / ``load_jobs``: the links each completed store / load job counts one
    transfer on, where the caller completes one job per call (vLLM's offloading
    connector; the scheduler adapter sets them), else None.
    """

    def __init__(self, manager: Any, rec: Recorder, tier: TierRecorder, active: bool) -> None:
        super().__init__(manager, COMPONENT, active, rec, tier)
        self.host_hits: HostHits | None = None
        self.offload: LinkEvents = NULL_LINK
        self.store_jobs: LinkEvents | None = None
        self.load_jobs: LinkEvents | None = None
        #: requests whose load a worker reported failed (the connector adapter's)
        self.failed_loads: set[str] = set()
        self.refused: OrderedDict[Any, None] = OrderedDict()

    def resident(self) -> tuple[int, int]:
        """``(in_use, cached)`` chunks read from the manager."""
        m = self.target
        allocated = m._num_allocated_chunks - len(m._free_list)
        cached = m._num_evictable_cache_chunks
        return allocated - cached, cached

    def refuse(self, keys: Iterable[Any]) -> int:
        """Remember refused ``keys``; return how many were not refused before."""
        refused, new = self.refused, 0
        for key in keys:
            if key in refused:
                continue
            refused[key] = None
            new += 1
            if len(refused) > MAX_REFUSED_KEYS:
                refused.popitem(last=False)
        return new


def _store_prepared(inst: OffloadingInstrumentation, state: None, output: Any,
                    keys: Collection[Any], req_context: Any) -> None:
    if output is None:  # refused before anything was inserted: absent keys were refused
        lookup = inst.target.lookup  # vLLM's own answer, no side effect (a MISS: absent)
        inst.offload.drop(inst.refuse(k for k in keys if lookup(k, req_context).name == "MISS"))
        return
    if output.keys_to_store:
        inst.tier.allocate(len(output.keys_to_store))
    if output.evicted_keys:
        inst.tier.evict(len(output.evicted_keys), "capacity", keys=output.evicted_keys)


#: Chunks being written, read before the call (vLLM's own count: O(1), in C).
_writes_pending = attr_path("target._num_write_pending_chunks")


def _store_completed(inst: OffloadingInstrumentation, pending: int, result: None,
                     keys: Collection[Any], req_context: Any, success: bool = True) -> None:
    stores = inst.store_jobs
    if success and stores is not None:  # one store job: its chunks moved
        stores.transfer(len(keys), 0)
    landed = pending - inst.target._num_write_pending_chunks  # written (or dropped) now
    if landed <= 0:
        return
    inst.tier.free(landed)  # the written chunks leave "in use"...
    if success:  # ...and land as cached data; keyed when they are exactly the call's keys
        inst.tier.store(landed, keys=keys if landed == len(keys) else None)
        refused = inst.refused
        if refused and not refused.keys().isdisjoint(keys):  # one C pass in the common case
            for key in keys:
                refused.pop(key, None)
    else:
        inst.offload.fail(landed)


def _evictable(inst: OffloadingInstrumentation, *args: Any, **kwargs: Any) -> int:
    """Idle cached chunks before the call (vLLM's count moves once per chunk whose
    reference count goes 0 -> 1 or 1 -> 0)."""
    return int(inst.target._num_evictable_cache_chunks)


def _load_prepared(inst: OffloadingInstrumentation, evictable: int, result: Any,
                   keys: Collection[Any], req_context: Any) -> None:
    idle = evictable - inst.target._num_evictable_cache_chunks  # taken out of the cache
    inst.tier.reuse(idle, keys=keys)  # a second reader of a chunk being read changes no state
    if inst.host_hits is not None:
        inst.host_hits.add(req_context.req_id, len(keys))


def _load_completed(inst: OffloadingInstrumentation, evictable: int, result: None,
                    keys: Collection[Any], req_context: Any) -> None:
    """A load job completed: one transfer of its chunks (where ``load_jobs``), or a
    failed one where a worker reported it failed, and the chunks whose last reader
    finished are idle again."""
    loads = inst.load_jobs
    if loads is not None:
        failed = inst.failed_loads
        if failed and req_context.req_id in failed:
            failed.discard(req_context.req_id)
            loads.fail(len(keys))
        else:
            loads.transfer(len(keys), 0)
    _read_completed(inst, evictable, result, keys, req_context)


def _read_completed(inst: OffloadingInstrumentation, evictable: int, result: None,
                    keys: Collection[Any], req_context: Any) -> None:
    last = inst.target._num_evictable_cache_chunks - evictable  # their last reader finished
    if last:
        inst.tier.free(last, cached=True)  # in use -> cached


def _write_prepared(inst: OffloadingInstrumentation, state: None, output: Any,
                    keys: Collection[Any], req_context: Any) -> None:
    """A promotion from a secondary tier reserving host chunks (not an offload: no drop
    when refused, and no store when it lands)."""
    if output is None:
        return
    if output.keys_to_store:
        inst.tier.allocate(len(output.keys_to_store))
    if output.evicted_keys:
        inst.tier.evict(len(output.evicted_keys), "capacity", keys=output.evicted_keys)


def _write_completed(inst: OffloadingInstrumentation, pending: int, result: None,
                     keys: Collection[Any], req_context: Any, success: bool = True) -> None:
    """A promotion landed (in use -> cached) or failed (the chunks are emptied)."""
    landed = pending - inst.target._num_write_pending_chunks
    if landed > 0:
        inst.tier.free(landed, cached=bool(success))


def _deferred_released(inst: OffloadingInstrumentation, pending: int, result: None,
                       chunk_ids: Collection[int]) -> None:
    """vLLM 0.34's tiering holds the chunks of a failed promotion out of the free pool
    (``defer_write_release``: still written-pending, as vLLM counts them) until a tier
    says it let go of them; ``release_deferred_write`` then empties them, as a failed
    write's are."""
    released = pending - inst.target._num_write_pending_chunks
    if released > 0:
        inst.tier.free(released, cached=False)


def _read_prepared(inst: OffloadingInstrumentation, evictable: int, result: Any,
                   keys: Collection[Any], req_context: Any) -> None:
    """A cascade to a secondary tier pinning host chunks while it reads them."""
    idle = evictable - inst.target._num_evictable_cache_chunks
    if idle:
        inst.tier.reuse(idle)  # unkeyed: a cascade read is not an onload


def _reset_before(inst: OffloadingInstrumentation) -> tuple[int, int]:
    return inst.resident()


def _reset_after(inst: OffloadingInstrumentation, resident: tuple[int, int],
                 result: None) -> None:
    in_use, cached = resident
    inst.tier.free(in_use)
    inst.tier.evict(cached, "reset")
    inst.refused.clear()


SPEC = AdapterSpec(COMPONENT, ("CPUOffloadingManager",), (
    Hook("prepare_store", ("keys", "req_context"), "allocate, evict, drop",
         after=_store_prepared, reiterable=("keys",)),
    Hook("complete_store", ("keys", "req_context", "success"), "free, store, fail, transfer",
         before=_writes_pending, after=_store_completed, reiterable=("keys",)),
    Hook("prepare_load", ("keys", "req_context"), "reuse", before=_evictable,
         after=_load_prepared, reiterable=("keys",)),
    Hook("complete_load", ("keys", "req_context"), "free, transfer", before=_evictable,
         after=_load_completed),
    Hook("reset_cache", (), "free, evict", before=_reset_before, after=_reset_after),
    # The tiering primary tier (``CPUPrimaryTierOffloadingManager``) binds these aliases
    # of the methods above in its ``__init__``: promotions and cascade reads call them.
    Hook("prepare_write", ("keys", "req_context"), "allocate, evict", after=_write_prepared,
         reiterable=("keys",), optional=True),
    Hook("complete_write", ("keys", "req_context", "success"), "free",
         before=_writes_pending, after=_write_completed, optional=True),
    Hook("prepare_read", ("keys", "req_context"), "reuse", before=_evictable,
         after=_read_prepared, optional=True),
    Hook("complete_read", ("keys", "req_context"), "free", before=_evictable,
         after=_read_completed, optional=True),
    Hook("release_deferred_write", ("chunk_ids",), "free", before=_writes_pending,
         after=_deferred_released, optional=True),
), state=("_num_chunks", "_num_allocated_chunks", "_free_list", "_num_evictable_cache_chunks",
          "_num_write_pending_chunks", "lookup"))


def instrument_offloading_manager(manager: Any, rec: Recorder, *, block_tokens: int,
                                  block_bytes: int = 0, tier: str = HOST, gpu_tier: str = GPU,
                                  host_hits: HostHits | None = None) -> OffloadingInstrumentation:
    """Count a vLLM ``CPUOffloadingManager`` as tier ``tier`` of ``rec``.

    Args:
        manager: the offloading connector's manager (``spec.get_manager()``).
        rec: the recorder.
        block_tokens: tokens per chunk (GPU block size x ``blocks_per_chunk``).
        block_bytes: bytes per chunk (0 if unknown).
        tier: this tier's name; ``gpu_tier`` is the tier chunks are offloaded from.
        host_hits: where to leave host hits for the lookup adapter to attribute.

    Raises:
        AdapterError: not an offloading manager, or already instrumented.
    """
    def make(active: bool) -> OffloadingInstrumentation:
        capacity = int(getattr(manager, "_num_chunks", 0))
        add = rec.add_tier if active else TierRecorder  # an unknown manager exports nothing
        inst = OffloadingInstrumentation(manager, rec, add(tier, capacity, block_tokens,
                                                           block_bytes), active)
        if active:
            inst.host_hits = host_hits
            inst.offload = rec.link(gpu_tier, tier)
        return inst

    inst = instrument(manager, SPEC, make)
    if inst.active:
        inst.tier.set_resident_source(inst.resident)
        inst.on_unwrap(lambda: inst.tier.set_resident_source(None))
    return inst
