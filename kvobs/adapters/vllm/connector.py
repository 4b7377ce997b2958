"""vLLM 0.33 ``OffloadingConnectorScheduler`` -> gpu<->host bytes and seconds, in the scheduler.

The workers' results reach the scheduler process once per step, in
``update_connector_output(connector_output)``: ``kv_connector_worker_meta`` is an
``OffloadingWorkerMetadata`` with ``completed_jobs`` (``{job_id: workers reporting}``)
and ``transfer_stats`` (store / load bytes and times, summed across TP workers). vLLM
completes a job once every worker has reported it and then calls its manager's
``complete_store(keys)`` / ``complete_load(keys)``, once per job: that is where each
transfer is counted (:mod:`kvobs.adapters.vllm.offloading`, one ``transfer`` of the
job's chunks on ``link("gpu", "host")`` or ``link("host", "gpu")``, in host chunks, so
host stores equal gpu->host transfer blocks). Jobs from before a cache reset (stale)
complete nothing, and count nothing.

After the call, this adapter adds the bytes and seconds the output reports:

* bytes are exactly vLLM's ``OffloadingConnectorStats`` ``store_bytes`` /
  ``load_bytes``, counted in the step that reports them (as vLLM's own
  ``vllm:kv_offload_*_bytes`` counts them), whether or not a job completes in it;
* seconds count each transfer once. Every worker (``config.num_workers``: the tensor-
  and pipeline-parallel world) moves its shard of a job and times it on its own copy
  stream; vLLM's ``store_time`` / ``load_time`` (what ``vllm:kv_offload_*_time`` counts)
  add the shards up. The shards move at the same time, on their own devices and links,
  so a transfer's time is the mean of its shards' times: vLLM's figure over the number
  of workers (for equal shards, as tensor parallelism makes them, also the slowest
  shard's). This is the onload cost the net benefit subtracts;
* duration samples come through the same channel, so the engine core's endpoint carries
  the ``kvobs_transfer_duration_seconds`` histogram and no worker endpoint is needed.
  vLLM sends each shard's size (``sizes``) but only the step's summed time, so each job
  a step reports (its shards over the workers) is one sample of the step's mean job
  time: exact when a step reports one job a direction (the usual case), the jobs' mean
  otherwise. The samples add up to the seconds above. A worker's own per-shard device
  times are an opt-in endpoint of its own (:mod:`kvobs.adapters.vllm.transfers`).

After ``update_state_after_alloc`` (the loads of an admitted request planned), the
request's external hits are split by source with the connector's own
``get_external_cache_hit_sources`` (what vLLM's ``hits_by_source`` reads) and left for
the lookup adapter (:class:`~kvobs.adapters.vllm.lookups.ExternalHits`).

Example:
    >>> side = scheduler.connector.connector_scheduler                 # doctest: +SKIP
    >>> inst = instrument_connector_scheduler(side, rec)               # doctest: +SKIP
    >>> rec.snapshot().link("gpu", "host").bytes                       # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

from kvobs.adapters.api import AdapterSpec, Hook, Instrumentation, instrument
from kvobs.adapters.vllm.lookups import ExternalHits
from kvobs.recorder import LinkRecorder, Recorder
from kvobs.tiers import DISK, GPU, HOST

COMPONENT = "vllm.offloading_connector"
#: Failed load jobs remembered until vLLM completes them.
MAX_FAILED_LOADS = 4096


class ConnectorInstrumentation(Instrumentation):
    """The wrapper on one ``OffloadingConnectorScheduler``: ``offload`` / ``onload`` are
    the gpu->host / host->gpu links its bytes and seconds go to."""

    def __init__(self, side: Any, rec: Recorder, active: bool) -> None:
        super().__init__(side, COMPONENT, active, rec)
        # unregistered links until active (an unknown connector exports nothing)
        self.offload = LinkRecorder(GPU, HOST)
        self.onload = LinkRecorder(HOST, GPU)
        self.external: ExternalHits | None = None
        #: requests whose load vLLM's workers reported failed, until vLLM completes it
        #: (vLLM 0.34's ``failed_recving``; its ``complete_load`` does not say it failed)
        self.failed_loads: set[str] = set()
        #: workers that each time a shard of every job (vLLM's ``config.num_workers``)
        self.workers = max(int(getattr(getattr(side, "config", None), "num_workers", 1)
                               or 1), 1)


def _failed(inst: ConnectorInstrumentation, connector_output: Any) -> None:
    """Before vLLM completes this output's jobs: the requests whose load a worker reported
    failed (``KVConnectorOutput.failed_recving``, vLLM 0.34 on; only an async load can
    fail, a failed sync load stops the worker), so that the host tier counts that load as
    a failure when vLLM completes it (once every worker reported it, maybe a later step).
    Stores need nothing: vLLM completes a failed one with ``success=False``."""
    failed = getattr(connector_output, "failed_recving", None)
    if not failed:
        return
    inst.failed_loads.update(failed)
    while len(inst.failed_loads) > MAX_FAILED_LOADS:  # loads vLLM never completed
        inst.failed_loads.pop()


def _reported(inst: ConnectorInstrumentation, state: None, result: None,
              connector_output: Any) -> None:
    """The store / load bytes, seconds and duration samples the workers report in this
    output (none in a step where no worker reported: no worker metadata)."""
    stats = getattr(getattr(connector_output, "kv_connector_worker_meta", None),
                    "transfer_stats", None)
    if stats is None:
        return
    _add(inst.offload, stats.store, inst.workers)
    _add(inst.onload, stats.load, inst.workers)


def _add(link: LinkRecorder, direction: Any, workers: int) -> None:
    """One direction's ``DirectionalTransferStats``: bytes, the jobs' time (the shards'
    sum over ``workers``) and one sample of the mean job time per job reported."""
    if direction.bytes:
        link.add_bytes(direction.bytes)
    seconds = direction.time / workers
    if seconds:
        link.add_seconds(seconds)
    if direction.sizes:  # a shard timed and sized (vLLM records both or neither)
        jobs = max(round(len(direction.sizes) / workers), 1)
        for _ in range(jobs):
            link.sample(seconds / jobs)


def _external(inst: ConnectorInstrumentation, request: Any, blocks: Any,
              num_external_tokens: int) -> int:
    """The gate of ``update_state_after_alloc``: the request loads external tokens."""
    return num_external_tokens


def _planned(inst: ConnectorInstrumentation, state: None, result: None, request: Any,
             blocks: Any, num_external_tokens: int) -> None:
    """The loads of ``request`` are planned: split its external hits by source as vLLM's
    ``hits_by_source`` does (``get_external_cache_hit_sources``: ``disk`` -> disk hits,
    ``host`` and ``external_unspecified`` -> host hits; ``p2p``, a peer's cache, is
    neither)."""
    external = inst.external  # (the gate: external tokens) and a lookup adapter to tell
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
    Hook("update_connector_output", ("connector_output",), "transfer, fail",
         before=_failed, after=_reported),
    Hook("update_state_after_alloc", ("request", "blocks", "num_external_tokens"), "lookup",
         after=_planned, when=_external),
), state=("manager", "get_external_cache_hit_sources"))


def instrument_connector_scheduler(side: Any, rec: Recorder, *, gpu_tier: str = GPU,
                                   tier: str = HOST,
                                   external: ExternalHits | None = None,
                                   ) -> ConnectorInstrumentation:
    """Count the bytes and seconds an ``OffloadingConnectorScheduler``'s workers report into
    ``rec`` (its transfers are counted where vLLM completes them, in the manager: see
    :class:`~kvobs.adapters.vllm.offloading.OffloadingInstrumentation`'s ``store_jobs`` /
    ``load_jobs``, which ``instrument_scheduler`` sets).

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
        >>> rec.snapshot().link("gpu", "host").bytes                  # doctest: +SKIP
        49152
    """
    def make(active: bool) -> ConnectorInstrumentation:
        inst = ConnectorInstrumentation(side, rec, active)
        if active:
            inst.offload = rec.link(gpu_tier, tier)
            inst.onload = rec.link(tier, gpu_tier)
            inst.external = external
        return inst

    return instrument(side, SPEC, make)
