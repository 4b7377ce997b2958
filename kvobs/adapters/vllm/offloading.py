"""vLLM's ``CPUOffloadingManager`` (scheduler side of CPU offloading) -> the host tier.

One host block is one offloading *chunk* (``blocks_per_chunk`` GPU blocks). Mapping onto
the vocabulary of :mod:`kvobs.events`:

* ``prepare_store`` -> ``allocate`` the chunks about to be written (free -> in use);
  ``evicted_keys`` -> ``evict`` (capacity, keyed: thrash sees offloads evicted unused);
  ``None`` (the tier is full of chunks being read or written) -> ``drop`` on the
  gpu->host link, each distinct chunk once however often vLLM re-offers it (a bounded
  set of refused keys; a key is forgotten once it is stored);
* ``complete_store`` -> the chunks it completes that were being written leave "in use"
  (``free``) and land as cached data (``store``, keyed); a failed store only frees them
  and counts a ``fail`` on the link. vLLM's offloading connector calls it once per store
  job it completes, so with the connector instrumented (``store_jobs``) each call is also
  one ``transfer`` of the job's chunks on the gpu->host link: host stores equal gpu->host
  transfer chunks (the bytes and seconds come from :mod:`kvobs.adapters.vllm.connector`);
* ``prepare_load`` -> ``reuse`` of the chunks that had no reader (a host hit, cached ->
  in use; keyed: an onload for thrash) and the request's host hits for the lookup adapter;
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

Which chunks are being written, read or idle is replayed from these public calls and
their results (:mod:`kvobs.adapters.vllm.host_chunks`), not read from the manager's
private counters; occupancy at collection is that replay: resident = allocated chunks (in
use = being written, read or held, cached = readable and evictable). This is the figure vLLM's own
``kv_offload`` usage gauge misses: a full but idle CPU tier reads 100% resident here.

Example (needs vLLM)::

    from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager
    manager = CPUOffloadingManager(num_chunks=1024, cache_policy="arc")
    inst = instrument_offloading_manager(manager, rec, block_tokens=64, block_bytes=8 << 20,
                                         capacity=1024)
    rec.snapshot().tier("host").capacity_blocks     # 1024
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Any

from kvobs.adapters.api import AdapterSpec, Hook, Instrumentation, instrument
from kvobs.adapters.vllm.capacity import host_tier_capacity
from kvobs.adapters.vllm.host_chunks import HostChunks
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
        #: the manager's chunks, replayed from its calls (occupancy at each snapshot)
        self.chunks = HostChunks()
        #: vLLM's ``make_offload_key(block_hash, group)``: a GPU block's chunk key (None:
        #: a vLLM without it, whose refused and unfinished offloads then read ``other``)
        self.chunk_key: Callable[[Any, int], Any] | None = None

    def explain_misses(self, block_hashes: Sequence[Any]) -> tuple[int, int]:
        """``(dropped, in_flight)`` of GPU blocks a lookup missed although an LRU cache of
        the tiers' capacity would have held them: those whose offload this tier refused
        (and has not stored since), and those whose offload is still being written. A
        block's chunk key is vLLM's ``make_offload_key(block_hash, 0)`` (the first KV
        cache group; with ``blocks_per_chunk`` > 1 only a chunk's last block matches)."""
        refused, writing, chunk_key = self.refused, self.chunks.writing, self.chunk_key
        if chunk_key is None or (not refused and not writing):
            return 0, 0
        dropped = in_flight = 0
        for block_hash in block_hashes:
            key = chunk_key(block_hash, 0)
            if key in writing:
                in_flight += 1
            elif key in refused:
                dropped += 1
        return dropped, in_flight

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
    _write_prepared(inst, state, output, keys, req_context)


def _store_completed(inst: OffloadingInstrumentation, state: None, result: None,
                     keys: Collection[Any], req_context: Any, success: bool = True) -> None:
    stores = inst.store_jobs
    if success and stores is not None:  # one store job: its chunks moved
        stores.transfer(len(keys), 0)
    landed = inst.chunks.completed(keys, success)  # written (or dropped) now
    if not landed:
        return
    inst.tier.free(len(landed))  # the written chunks leave "in use"...
    if success:  # ...and land as cached data
        inst.tier.store(len(landed), keys=landed)
        refused = inst.refused
        if refused and not refused.keys().isdisjoint(landed):  # one C pass in the common case
            for key in landed:
                refused.pop(key, None)
    else:
        inst.offload.fail(len(landed))


def _load_prepared(inst: OffloadingInstrumentation, state: None, result: Any,
                   keys: Collection[Any], req_context: Any) -> None:
    idle = inst.chunks.pinned(keys)  # taken out of the cache
    inst.tier.reuse(idle, keys=keys)  # a second reader of a chunk being read changes no state
    if inst.host_hits is not None:
        inst.host_hits.add(req_context.req_id, len(keys))


def _load_completed(inst: OffloadingInstrumentation, state: None, result: None,
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
    _read_completed(inst, state, result, keys, req_context)


def _read_completed(inst: OffloadingInstrumentation, state: None, result: None,
                    keys: Collection[Any], req_context: Any) -> None:
    last = inst.chunks.unpinned(keys)  # their last reader finished
    if last:
        inst.tier.free(last, cached=True)  # in use -> cached


def _write_prepared(inst: OffloadingInstrumentation, state: None, output: Any,
                    keys: Collection[Any], req_context: Any) -> None:
    """Chunks reserved: for an offload, or for a promotion from a secondary tier (not an
    offload: no drop when refused, and no store when it lands)."""
    if output is None:
        return
    allocated, evicted = output.keys_to_store, output.evicted_keys
    inst.chunks.allocated(allocated, len(evicted))
    if allocated:
        inst.tier.allocate(len(allocated))
    if evicted:
        inst.tier.evict(len(evicted), "capacity", keys=evicted)


def _write_completed(inst: OffloadingInstrumentation, state: None, result: None,
                     keys: Collection[Any], req_context: Any, success: bool = True) -> None:
    """A promotion landed (in use -> cached) or failed (the chunks are emptied)."""
    landed = inst.chunks.completed(keys, bool(success))
    if landed:
        inst.tier.free(len(landed), cached=bool(success))


def _write_deferred(inst: OffloadingInstrumentation, state: None, result: Any,
                    keys: Collection[Any]) -> None:
    """vLLM 0.34's tiering fails a promotion but holds its chunks out of the free pool
    (``defer_write_release``: still in use, as vLLM counts them)."""
    inst.chunks.deferred(keys)


def _deferred_released(inst: OffloadingInstrumentation, state: None, result: None,
                       chunk_ids: Collection[int]) -> None:
    """``release_deferred_write``: a tier let go of the held chunks; they are emptied, as
    a failed write's are."""
    released = inst.chunks.released(len(chunk_ids))
    if released:
        inst.tier.free(released, cached=False)


def _read_prepared(inst: OffloadingInstrumentation, state: None, result: Any,
                   keys: Collection[Any], req_context: Any) -> None:
    """A cascade to a secondary tier pinning host chunks while it reads them."""
    idle = inst.chunks.pinned(keys)
    if idle:
        inst.tier.reuse(idle)  # unkeyed: a cascade read is not an onload


def _reset(inst: OffloadingInstrumentation, state: None, result: None) -> None:
    in_use, cached = inst.chunks.reset()
    inst.tier.free(in_use)
    inst.tier.evict(cached, "reset")
    inst.refused.clear()


SPEC = AdapterSpec(COMPONENT, ("CPUOffloadingManager",), (
    Hook("prepare_store", ("keys", "req_context"), "allocate, evict, drop",
         after=_store_prepared, reiterable=("keys",)),
    Hook("complete_store", ("keys", "req_context", "success"), "free, store, fail, transfer",
         after=_store_completed, reiterable=("keys",)),
    Hook("prepare_load", ("keys", "req_context"), "reuse", after=_load_prepared,
         reiterable=("keys",)),
    Hook("complete_load", ("keys", "req_context"), "free, transfer", after=_load_completed,
         reiterable=("keys",)),
    Hook("reset_cache", (), "free, evict", after=_reset),
    # The tiering primary tier (``CPUPrimaryTierOffloadingManager``) binds these aliases
    # of the methods above in its ``__init__``: promotions and cascade reads call them.
    Hook("prepare_write", ("keys", "req_context"), "allocate, evict", after=_write_prepared,
         reiterable=("keys",), optional=True),
    Hook("complete_write", ("keys", "req_context", "success"), "free",
         after=_write_completed, reiterable=("keys",), optional=True),
    Hook("prepare_read", ("keys", "req_context"), "reuse", after=_read_prepared,
         reiterable=("keys",), optional=True),
    Hook("complete_read", ("keys", "req_context"), "free", after=_read_completed,
         reiterable=("keys",), optional=True),
    Hook("defer_write_release", ("keys",), "", after=_write_deferred, reiterable=("keys",),
         optional=True),
    Hook("release_deferred_write", ("chunk_ids",), "free", after=_deferred_released,
         reiterable=("chunk_ids",), optional=True),
), state=("lookup",))


def instrument_offloading_manager(manager: Any, rec: Recorder, *, block_tokens: int,
                                  block_bytes: int = 0, capacity: int | None = None,
                                  tier: str = HOST, gpu_tier: str = GPU,
                                  host_hits: HostHits | None = None) -> OffloadingInstrumentation:
    """Count a vLLM ``CPUOffloadingManager`` as tier ``tier`` of ``rec``.

    Instrument it before its first store: its occupancy is replayed from its calls
    (:class:`~kvobs.adapters.vllm.host_chunks.HostChunks`), so chunks it already held
    would not be seen.

    Args:
        manager: the offloading connector's manager (``spec.get_manager()``).
        rec: the recorder.
        block_tokens: tokens per chunk (GPU block size x ``blocks_per_chunk``).
        block_bytes: bytes per chunk (0 if unknown).
        capacity: chunks the tier holds; None reads ``config_info()`` (vLLM 0.33+, a
            manager its spec built).
        tier: this tier's name; ``gpu_tier`` is the tier chunks are offloaded from.
        host_hits: where to leave host hits for the lookup adapter to attribute.

    Raises:
        AdapterError: not an offloading manager, or already instrumented.
        ConfigError: no ``capacity`` given and the manager publishes none.
    """
    def make(active: bool) -> OffloadingInstrumentation:
        if not active:  # an unknown manager exports nothing
            return OffloadingInstrumentation(manager, rec, TierRecorder(tier, 0, block_tokens, 0),
                                             active)
        chunks = capacity if capacity is not None else \
            host_tier_capacity(manager, block_tokens, tier).blocks
        inst = OffloadingInstrumentation(manager, rec, rec.add_tier(
            tier, chunks, block_tokens, block_bytes), active)
        inst.host_hits = host_hits
        inst.offload = rec.link(gpu_tier, tier)
        return inst

    inst = instrument(manager, SPEC, make)
    if inst.active:
        inst.tier.set_resident_source(inst.chunks.resident)
        inst.on_unwrap(lambda: inst.tier.set_resident_source(None))
        try:
            from vllm.v1.kv_offload.base import make_offload_key
        except ImportError:  # a vLLM without it: refused and unfinished offloads read other
            pass
        else:
            inst.chunk_key = make_offload_key
            if rec.miss_explainer is None:
                rec.miss_explainer = inst.explain_misses
                inst.on_unwrap(lambda: setattr(rec, "miss_explainer", None))
    return inst
