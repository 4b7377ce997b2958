"""vLLM HiSparse -> the host tier as a primary store, its page transfers and hot buffers.

HiSparse (vLLM 0.33+, ``HiSparseConnector`` with ``host_pool_gib``) keeps the sparse-MLA
latent KV of every computed page in a host pool: the pool is the primary store (every
page gets a host block at admission, so a full pool makes new requests wait), the GPU
resident pages are a write-back cache of it, and each request's hot buffer on the GPU
holds the top-k rows its sparse attention reads. Three objects of the scheduler process
carry it, and kvobs reads each where vLLM keeps it:

* **host tier** (``primary``): ``HiSparseCoordinator.get_host_block_pool()``, a
  ``BlockPool`` of ``hisparse_host_num_blocks`` blocks that publishes its KV events
  with medium ``CPU``. It is counted like the GPU pool
  (:func:`~kvobs.adapters.vllm.block_pool.instrument_block_pool`): in use = blocks a
  request or a pending page transfer references, cached = published prefixes nobody
  holds (what vLLM's ``vllm:hisparse_host_cache_usage_perc`` counts as free), evictions
  when a published page's block is reused. Capacity and bytes per block come from the
  ``KVCacheConfig`` (:func:`~kvobs.adapters.vllm.capacity.hisparse_host_capacity`).
* **page transfers**: ``HiSparseCoordinator.update_spills`` receives, once per step, the
  workers' ``enqueued_transfer_counts`` / ``completed_transfer_counts``; a
  ``SparseKVPageTransfer`` is complete when it leaves ``pending_spills`` there. Each one
  moves one page: a write-back (``restore=False``) is a ``gpu -> host`` transfer and a
  store on the host tier, a restore (``restore=True``, an imported tail read back before
  decode) a ``host -> gpu`` transfer. vLLM carries no byte field: a page is
  ``hisparse_host_block_stride`` bytes (the latent KV of every sparse layer for one
  block, rounded up to the shared pool's alignment when TP ranks share one host pool).
  A restore is copied into every TP rank's GPU, so it moves the page once per rank; a
  write-back is written once per host pool (once with a shared pool, once per rank
  without). With ``eager_host_mirror`` (vLLM's default) the worker mirrors the rows
  during the forward and the write-back completes without copying: its bytes are the
  page's, moved earlier. The workers report no transfer times, so these transfers have
  no seconds (the onload cost is unknown, never 0).
* **prefix hits by tier**: a prefix hit references host pages; in the same
  ``schedule()`` vLLM points each hit page at a GPU copy where one is still readable
  (``HiSparseCoordinator._adopt_copies``) and leaves the others null: their KV is read
  from the host pool. The lookup of a request with hit pages is held until then and
  recorded with the adopted pages' tokens as GPU hits and the rest as host hits (the hit
  total stays vLLM's ``PrefixCacheStats`` count).
* **hot buffers**: the workers' ``HiSparseKVConnectorStats`` (``cache_hits``,
  ``cache_misses``, ``host_to_device_bytes``: what ``vllm:hisparse_cache_hits`` /
  ``_misses`` / ``_host_to_device_bytes`` count) reach the scheduler with each step's
  ``KVConnectorOutput`` in ``HiSparseConnectorScheduler.update_connector_output``; kvobs
  adds them to ``kvobs_hot_buffer_lookups_total{outcome}`` and
  ``kvobs_hot_buffer_load_bytes_total`` (row loads into hot buffers, not page transfers).

Example:
    >>> inst = instrument_hisparse(scheduler, rec)             # doctest: +SKIP
    >>> [part.component for part in inst]                      # doctest: +SKIP
    ['vllm.block_pool', 'vllm.hisparse', 'vllm.hisparse_stats']
    >>> rec.snapshot().tier("host").in_use_blocks              # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import ExitStack
from typing import Any

from kvobs.adapters.api import (
    AdapterSpec,
    Hook,
    Instrumentation,
    class_names,
    guarded,
    instrument,
    warn_once,
)
from kvobs.adapters.vllm.block_pool import instrument_block_pool
from kvobs.adapters.vllm.capacity import hisparse_host_capacity, request_blocks
from kvobs.adapters.vllm.lookups import ExternalHits, LookupInstrumentation, relookup
from kvobs.events import NULL_TIER
from kvobs.recorder import LinkRecorder, Recorder
from kvobs.telemetry.series import Series
from kvobs.tiers import GPU, HOST, PRIMARY

COMPONENT = "vllm.hisparse"
STATS_COMPONENT = "vllm.hisparse_stats"
#: The ``HiSparseKVConnectorStats`` fields kvobs adds up (vLLM's delta lists).
HOT_FIELDS = ("cache_hits", "cache_misses", "host_to_device_bytes")


class CoordinatorInstrumentation(Instrumentation):
    """The wrappers on one ``HiSparseCoordinator``: completed page transfers, and which
    hit pages got a GPU copy (for ``hits``, when the lookups are split).

    ``page_bytes``: bytes of one page; ``restore_copies`` / ``writeback_copies``: how many
    copies of a page a restore / a write-back makes (TP ranks, shared host pool).
    """

    hits: HostServedHits | None = None

    def __init__(self, coordinator: Any, rec: Recorder, active: bool, *, page_bytes: int,
                 restore_copies: int, writeback_copies: int) -> None:
        registered = active and HOST in rec.tier_names
        super().__init__(coordinator, COMPONENT, active, rec,
                         rec.tier(HOST) if registered else NULL_TIER)
        self.writeback = rec.link(GPU, HOST) if active else LinkRecorder(GPU, HOST)
        self.restore = rec.link(HOST, GPU) if active else LinkRecorder(HOST, GPU)
        self.page_bytes = page_bytes
        self.restore_copies = restore_copies
        self.writeback_copies = writeback_copies


def _candidates(inst: CoordinatorInstrumentation, enqueued_counts: Mapping[int, int],
                completed_counts: Mapping[int, int]) -> list[tuple[int, bool]]:
    """The pending transfers this report may complete, with their direction."""
    pending = inst.target.pending_spills
    out = []
    for transfer_id in {*enqueued_counts, *completed_counts}:
        spill = pending.get(transfer_id)
        if spill is not None:
            out.append((transfer_id, bool(spill.restore)))
    return out


def _completed(inst: CoordinatorInstrumentation, candidates: list[tuple[int, bool]], result: None,
               enqueued_counts: Mapping[int, int], completed_counts: Mapping[int, int]) -> None:
    if not candidates:
        return
    pending = inst.target.pending_spills
    restores = writebacks = 0
    for transfer_id, restore in candidates:
        if transfer_id not in pending:  # vLLM completed it in this call
            if restore:
                restores += 1
            else:
                writebacks += 1
    for _ in range(writebacks):  # each page transfer is one operation of one block
        inst.writeback.transfer(1, inst.page_bytes * inst.writeback_copies)
    if writebacks:
        inst.tier.store(writebacks)
    for _ in range(restores):
        inst.restore.transfer(1, inst.page_bytes * inst.restore_copies)


class HostServedHits(ExternalHits):
    """Lookups of requests with hit pages, held until vLLM adopts GPU copies for them;
    then recorded with the pages read from the host pool as host hits.

    The lookup adapter holds a lookup here (``hold``) when :meth:`__contains__` says the
    request has pages to adopt; :meth:`adopted` records it.

    Example:
        >>> from kvobs.recorder import Recorder
        >>> rec = Recorder()
        >>> hits = HostServedHits(rec, coordinator=None)
        >>> hits.hold("r1", tokens=300, gpu_hit=256, keys=None)
        >>> hits.adopted("r1", host_tokens=192)
        >>> lookups = rec.snapshot().lookups; (lookups.gpu_hit, lookups.host_hit)
        (64, 192)
    """

    def __init__(self, rec: Recorder, coordinator: Any, max_requests: int = 4096) -> None:
        super().__init__(rec, max_requests)
        self.coordinator = coordinator

    def __bool__(self) -> bool:
        return True

    def __contains__(self, request_id: object) -> bool:
        """Whether ``request_id`` has hit pages vLLM has not adopted copies for yet."""
        state = self.coordinator.request_states.get(request_id)
        return bool(state is not None and state.pages_to_adopt)

    def adopted(self, request_id: str, host_tokens: int) -> None:
        """vLLM adopted GPU copies for ``request_id``'s hit pages; ``host_tokens`` of its
        hit are read from the host pool."""
        held = self._held.pop(request_id, None)
        if held is None:
            return
        tokens, gpu_hit, keys, preempted = held
        host = min(host_tokens, gpu_hit)
        if preempted:
            relookup(self.rec, tokens, gpu_hit - host, host, 0)
        else:
            self.rec.lookup(tokens, gpu_hit=gpu_hit - host, host_hit=host, keys=keys,
                            cacheable_tokens=tokens - 1)


def _gpu_pages(coordinator: Any, request_id: str, pages: int) -> int:
    """Hit pages of ``request_id`` with a GPU copy (the first resident group's row)."""
    manager = coordinator.resident_managers[0]
    return sum(1 for page in range(pages)
               if manager.get_resident_page(request_id, page) is not None)


def _before_adoption(inst: CoordinatorInstrumentation, request_id: str, state: Any,
                     host_blocks: Any) -> int:
    return len(host_blocks)


def _after_adoption(inst: CoordinatorInstrumentation, pages: int, result: None,
                    request_id: str, state: Any, host_blocks: Any) -> None:
    hits = inst.hits
    if hits is not None:
        host_pages = pages - _gpu_pages(inst.target, request_id, pages)
        hits.adopted(request_id, host_pages * inst.target.host_manager.block_size)


COORDINATOR_SPEC = AdapterSpec(COMPONENT, ("HiSparseCoordinator",), (
    Hook("update_spills", ("enqueued_counts", "completed_counts"), "transfer, store",
         before=_candidates, after=_completed),
    Hook("_adopt_copies", ("request_id", "state", "host_blocks"), "track",
         before=_before_adoption, after=_after_adoption, optional=True),
), state=("pending_spills", "get_host_block_pool", "host_manager.block_size",
          "request_states", "resident_managers"))
"""``update_spills``: once per step, the pending map read before and after it.
``_adopt_copies``: once per admitted request with hit pages, in the ``schedule()`` that
admits it (private in vLLM: a vLLM without it gets unsplit hits, the rest goes on)."""


class HotBufferInstrumentation(Instrumentation):
    """The wrapper on one ``HiSparseConnectorScheduler``: the workers' hot-buffer counts
    (exported by :meth:`series`, registered as a source of the recorder)."""

    def __init__(self, side: Any, rec: Recorder, active: bool) -> None:
        super().__init__(side, STATS_COMPONENT, active, rec)
        self.hits = 0
        self.misses = 0
        self.load_bytes = 0

    def series(self) -> Series:
        """``kvobs_hot_buffer_*`` values for the exposition (read at collection)."""
        return {
            "kvobs_hot_buffer_lookups_total": [({"outcome": "hit"}, self.hits),
                                               ({"outcome": "miss"}, self.misses)],
            "kvobs_hot_buffer_load_bytes_total": [({}, self.load_bytes)],
        }


def _hot_counts(inst: HotBufferInstrumentation, state: None, result: None,
                connector_output: Any) -> None:
    stats = getattr(connector_output, "kv_connector_stats", None)
    data = getattr(stats, "data", None)
    if not data:
        return
    hits, misses, nbytes = (data.get(field) or () for field in HOT_FIELDS)
    inst.hits += int(sum(hits))
    inst.misses += int(sum(misses))
    inst.load_bytes += int(sum(nbytes))


STATS_SPEC = AdapterSpec(STATS_COMPONENT, ("HiSparseConnectorScheduler",), (
    Hook("update_connector_output", ("connector_output",), "track", after=_hot_counts),
))


def hisparse_coordinator(scheduler: Any) -> Any:
    """The ``HiSparseCoordinator`` of a scheduler whose connector is HiSparse, or None."""
    side = getattr(getattr(scheduler, "connector", None), "connector_scheduler", None)
    if side is None or "HiSparseConnectorScheduler" not in class_names(side):
        return None
    return getattr(side, "coordinator", None)


@guarded(COMPONENT)
def _request_blocks(pool: Instrumentation, vllm_config: Any, config: Any) -> None:
    """Give the host pool's tier (``pool``'s) and the GPU tier the blocks one request
    needs in each, as vLLM counts them (:func:`~kvobs.adapters.vllm.capacity.request_blocks`).
    A spec kvobs cannot read is counted under ``vllm.hisparse`` and leaves both 0: the
    capacity log then goes by tokens."""
    gpu, host = request_blocks(vllm_config, config)
    pool.tier.request_blocks = host
    if GPU in pool.rec.tier_names:
        pool.rec.tier(GPU).request_blocks = gpu


def instrument_hisparse(scheduler: Any, rec: Recorder,
                        lookups: LookupInstrumentation | None = None) -> list[Instrumentation]:
    """Instrument the HiSparse host pool, page transfers and hot-buffer counts of a vLLM
    ``Scheduler`` (its GPU tier is instrumented as usual, see
    :func:`~kvobs.adapters.vllm.manager.instrument_scheduler`).

    Registers the ``host`` tier as ``primary`` and gives both tiers the blocks one
    request of ``max_model_len`` needs in them (vLLM's own per-group counts), so the
    capacity log's concurrency is the smaller of the two pools' limits, as vLLM's
    "GPU + host KV cache size" line. With ``lookups`` (the scheduler's lookup adapter),
    prefix hits are split into the pages vLLM gives a GPU copy and those it reads from
    the host pool.

    Returns:
        The parts (host pool, transfers, hot-buffer counts); empty when the scheduler
        has no HiSparse connector.

    Raises:
        AdapterError: a part is already instrumented (parts wrapped before are restored).
    """
    coordinator = hisparse_coordinator(scheduler)
    if coordinator is None:
        return []
    side = scheduler.connector.connector_scheduler
    config = scheduler.kv_cache_manager.kv_cache_config
    vllm_config = getattr(scheduler, "vllm_config", None)
    host = hisparse_host_capacity(config)
    tp = int(getattr(getattr(vllm_config, "parallel_config", None),
                     "tensor_parallel_size", 1) or 1)
    shared = bool(getattr(config, "hisparse_shared_host_pool", False))
    parts: list[Instrumentation] = []
    with ExitStack() as undo:
        def unwrap_all() -> None:
            for part in reversed(parts):
                part.unwrap()
        undo.callback(unwrap_all)
        pool = instrument_block_pool(coordinator.get_host_block_pool(), rec, tier=HOST,
                                     block_tokens=host.block_tokens,
                                     block_bytes=host.block_bytes, role=PRIMARY)
        parts.append(pool)
        if pool.active:
            _request_blocks(pool, vllm_config, config)

        def make(active: bool) -> CoordinatorInstrumentation:
            return CoordinatorInstrumentation(coordinator, rec, active,
                                              page_bytes=host.block_bytes, restore_copies=tp,
                                              writeback_copies=1 if shared else tp)
        spills = instrument(coordinator, COORDINATOR_SPEC, make)
        parts.append(spills)
        adopting = "_adopt_copies" in spills.wrapped_methods
        if lookups is not None and adopting and coordinator.resident_managers:
            hits = HostServedHits(rec, coordinator)  # lookups with hit pages wait for it
            spills.hits = hits
            lookups.external, lookups.deferred = hits, hits
        elif lookups is not None and spills.active:
            warn_once(f"{COMPONENT}:_adopt_copies", "kvobs_instrument_partial",
                      component=COMPONENT, missing="HiSparseCoordinator._adopt_copies",
                      effect="prefix hits are all counted as GPU hits (no host split)")
        hot = instrument(side, STATS_SPEC, lambda active: HotBufferInstrumentation(
            side, rec, active))
        parts.append(hot)
        if hot.active:
            rec.add_source(hot.series)
            hot.on_unwrap(lambda: rec.remove_source(hot.series))
        undo.pop_all()
    return parts
