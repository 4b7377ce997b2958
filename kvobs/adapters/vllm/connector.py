"""vLLM 0.33 ``OffloadingConnectorScheduler`` -> gpu<->host transfers, in the scheduler.

The workers' results reach the scheduler process once per step, in
``update_connector_output(connector_output)``: ``kv_connector_worker_meta`` is an
``OffloadingWorkerMetadata`` with ``completed_jobs`` (``{job_id: workers reporting}``)
and ``transfer_stats`` (store / load bytes and times, summed across TP workers). vLLM
completes a job once every worker has reported it (its ``pending_count`` reaches 0)
and skips jobs from before a cache reset (stale). Before the call, this adapter reads
which jobs will complete, their direction (``is_store``) and chunk count (its keys);
after it, each completed job is one ``transfer`` on ``link("gpu", "host")`` (stores) or
``link("host", "gpu")`` (loads), in host chunks (the slower tier's blocks, so host
stores equal gpu->host transfer blocks).

After ``update_state_after_alloc`` (the loads of an admitted request planned), the
request's external hits are split by source with the connector's own
``get_external_cache_hit_sources`` (what vLLM's ``hits_by_source`` reads) and left for
the lookup adapter (:class:`~kvobs.adapters.vllm.lookups.ExternalHits`).

Bytes are exactly vLLM's ``OffloadingConnectorStats`` ``store_bytes`` / ``load_bytes``:
a step's reported bytes go to the jobs completing in it (split by chunks, the remainder
to the last job); bytes reported in a step where no job of that direction completes
(a TP worker reporting before the others) wait for the next completion.

Seconds count each transfer once. Every worker (``config.num_workers``: the tensor- and
pipeline-parallel world) moves its shard of a job and times it on its own copy stream;
vLLM's ``store_time`` / ``load_time`` (what ``vllm:kv_offload_*_time`` counts) add the
shards up. The shards move at the same time, on their own devices and links, so a
transfer's time is the mean of its shards' times: vLLM's figure over the number of
workers (for equal shards, as tensor parallelism makes them, also the slowest shard's).
This is the onload cost the net benefit subtracts, in the scheduler's process whatever
process the workers run in; no duration sample is taken here: the per-shard device
durations come from the workers (:mod:`kvobs.adapters.vllm.transfers`).

Example:
    >>> side = scheduler.connector.connector_scheduler                 # doctest: +SKIP
    >>> inst = instrument_connector_scheduler(side, rec)               # doctest: +SKIP
    >>> rec.snapshot().link("gpu", "host").bytes                       # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

from kvobs.adapters._hooks import AdapterSpec, Hook, Instrumentation, instrument
from kvobs.adapters.vllm.lookups import ExternalHits
from kvobs.events import LinkEvents
from kvobs.recorder import LinkRecorder, Recorder
from kvobs.tiers import DISK, GPU, HOST

COMPONENT = "vllm.offloading_connector"

#: What one worker output reports: the chunks of each store and each load job it
#: completes, then store / load bytes and seconds.
Report = tuple[list[int], list[int], int, int, float, float]


class ConnectorInstrumentation(Instrumentation):
    """The wrapper on one ``OffloadingConnectorScheduler``.

    ``carried_store_bytes`` / ``carried_load_bytes``: bytes reported before their jobs
    completed, waiting for the next completion in that direction.
    """

    def __init__(self, side: Any, rec: Recorder, active: bool) -> None:
        super().__init__(side, COMPONENT, active, rec)
        # unregistered links until active (an unknown connector exports nothing)
        self.offload = LinkRecorder(GPU, HOST)
        self.onload = LinkRecorder(HOST, GPU)
        self.carried_store_bytes = 0
        self.carried_load_bytes = 0
        self.external: ExternalHits | None = None
        #: workers that each time a shard of every job (vLLM's ``config.num_workers``)
        self.workers = max(int(getattr(getattr(side, "config", None), "num_workers", 1)
                               or 1), 1)


_NOTHING: Report = ([], [], 0, 0, 0.0, 0.0)


def _completing(inst: ConnectorInstrumentation, connector_output: Any) -> Report:
    """Jobs this output completes, and the store / load bytes and seconds it reports.

    Runs in every step whose output carries worker metadata (the wrapper's gate skips
    the rest): an output with nothing completed and nothing moved is answered with the
    shared empty report.
    """
    meta: Any = getattr(connector_output, "kv_connector_worker_meta", None)
    if meta is None:
        return _NOTHING
    try:
        stats = meta.transfer_stats
        store, load = stats.store, stats.load
        reported = (store.bytes or 0, load.bytes or 0, store.time or 0.0, load.time or 0.0)
        completed = meta.completed_jobs
    except AttributeError:  # a worker metadata of another shape: read what it has
        stats = getattr(meta, "transfer_stats", None)
        reported = (_reported(stats, "store", "bytes"), _reported(stats, "load", "bytes"),
                    _reported(stats, "store", "time"), _reported(stats, "load", "time"))
        completed = getattr(meta, "completed_jobs", None)
    if not completed:
        if reported[0] or reported[1] or reported[2] or reported[3]:
            return ([], [], *reported)
        return _NOTHING
    side = inst.target
    jobs, stale_below = side._jobs, side._stale_job_threshold
    stores: list[int] = []
    loads: list[int] = []
    for job_id, count in completed.items():
        if job_id < stale_below:
            continue  # flushed by a cache reset: vLLM completes nothing for it
        status = jobs.get(job_id)
        if status is not None and status.pending_count - count <= 0:
            (stores if status.is_store else loads).append(len(status.keys))
    return (stores, loads, *reported)


def _reported(stats: Any, direction: str, field: str) -> Any:
    """``stats.<direction>.<field>`` (bytes or time) of vLLM's ``TransferStats``, or 0."""
    return getattr(getattr(stats, direction, None), field, 0) or 0


def _landed(inst: ConnectorInstrumentation, state: Report, result: None,
            connector_output: Any) -> None:
    if state is _NOTHING:
        return
    stores, loads, store_bytes, load_bytes, store_s, load_s = state
    if store_s:
        inst.offload.add_seconds(store_s / inst.workers)
    if load_s:
        inst.onload.add_seconds(load_s / inst.workers)
    if stores:  # bytes carried from earlier steps go with this step's jobs
        inst.carried_store_bytes = _count(inst.offload, stores,
                                          inst.carried_store_bytes + store_bytes)
    elif store_bytes:
        inst.carried_store_bytes += store_bytes
    if loads:
        inst.carried_load_bytes = _count(inst.onload, loads, inst.carried_load_bytes + load_bytes)
    elif load_bytes:
        inst.carried_load_bytes += load_bytes


def _count(link: LinkEvents, jobs: list[int], nbytes: int) -> int:
    """One transfer per job, ``nbytes`` split by chunks; returns the bytes left (0)."""
    total = sum(jobs) or 1
    left = nbytes
    for i, chunks in enumerate(jobs):
        share = left if i == len(jobs) - 1 else nbytes * chunks // total
        link.transfer(chunks, share, None)
        left -= share
    return left


def _planned(inst: ConnectorInstrumentation, state: None, result: None, request: Any,
             blocks: Any, num_external_tokens: int) -> None:
    """The loads of ``request`` are planned: split its external hits by source as vLLM's
    ``hits_by_source`` does (``get_external_cache_hit_sources``: ``disk`` -> disk hits,
    ``host`` and ``external_unspecified`` -> host hits; ``p2p``, a peer's cache, is
    neither)."""
    external = inst.external  # the gate: external tokens, and a lookup adapter to tell
    if external is None:
        return
    host = disk = 0
    for source, tokens in inst.target.get_external_cache_hit_sources(
            request, num_external_tokens).items():
        if source == DISK:
            disk += tokens
        elif source != "p2p":
            host += tokens
    external.arrive(request.request_id, host, disk)


SPEC = AdapterSpec(COMPONENT, ("OffloadingConnectorScheduler",), (
    # vLLM's workers report nothing (no worker metadata) in a step where no job completed
    Hook("update_connector_output", ("connector_output",), "transfer",
         before=_completing, after=_landed,
         when="getattr(connector_output, 'kv_connector_worker_meta', None) is not None"),
    Hook("update_state_after_alloc", ("request", "blocks", "num_external_tokens"), "lookup",
         after=_planned, when="num_external_tokens and inst.external is not None"),
), state=("_jobs", "_stale_job_threshold", "manager", "get_external_cache_hit_sources"))


def instrument_connector_scheduler(side: Any, rec: Recorder, *, gpu_tier: str = GPU,
                                   tier: str = HOST,
                                   external: ExternalHits | None = None,
                                   ) -> ConnectorInstrumentation:
    """Count the transfers an ``OffloadingConnectorScheduler`` completes into ``rec``.

    Args:
        side: ``scheduler.connector.connector_scheduler``.
        rec: the recorder.
        gpu_tier: the GPU tier's name; ``tier`` the offload medium's tier.
        external: where to leave each request's host / disk hits as the connector
            splits them (for the lookup adapter).

    Returns:
        The instrumentation (inactive, nothing wrapped and one warning naming what is
        missing, on a connector kvobs does not know).

    Raises:
        AdapterError: not an OffloadingConnectorScheduler, or already instrumented.

    Example:
        >>> inst = instrument_connector_scheduler(
        ...     scheduler.connector.connector_scheduler, rec)          # doctest: +SKIP
        >>> scheduler.update_from_output(out, model_runner_output)    # doctest: +SKIP
        >>> rec.snapshot().link("gpu", "host").blocks                 # doctest: +SKIP
        3
    """
    def make(active: bool) -> ConnectorInstrumentation:
        inst = ConnectorInstrumentation(side, rec, active)
        if active:
            inst.offload = rec.link(gpu_tier, tier)
            inst.onload = rec.link(tier, gpu_tier)
            inst.external = external
        return inst

    return instrument(side, SPEC, make)
