"""vLLM's ``OffloadingWorker`` (the worker side of offloading) -> transfer durations.

The worker process moves the KV data: ``submit_store(job_id, _, dst_spec)`` copies GPU
blocks to the offload medium, ``submit_load(job_id, src_spec, _)`` copies them back (the
GPU side is a ``GPULoadStoreSpec`` in vLLM 0.33, resolved ``DevicePointers`` from 0.34:
kvobs reads only the offload medium's spec, the same third / second parameter in both),
and ``get_finished()`` returns one ``TransferResult(job_id, success,
transfer_size, transfer_time)`` per job that completed. ``transfer_time`` is what vLLM's
CPU worker measures between two CUDA events on the copy stream, i.e. device time; a
worker that reports none is timed by wall clock from submission to the
``get_finished`` call that returned the job (an upper bound).

Every successful job is one sample of the shard's device time on the link of its
direction (``gpu -> host`` for stores, ``host -> gpu`` for loads). By default the links
are *timing-only* (``rec.link(..., counts=False)``), exported as
``kvobs_transfer_shard_duration_seconds`` alone: the engine core counts the transfers
(operations, blocks, bytes) and their durations from the worker metadata vLLM sends it
(:mod:`kvobs.adapters.vllm.connector`), so a sum over both processes never counts one
transfer twice. The vLLM plugin wraps a worker only with ``KVOBS_WORKER_METRICS=1``, in
a worker process of its own. ``counts=True`` counts the transfers here instead (host
chunks of the CPU-side spec), for a setup where only the worker is instrumented.

Example:
    >>> inst = instrument_offloading_worker(connector_worker.worker, rec)  # doctest: +SKIP
    >>> rec.link("gpu", "host", counts=False).durations                   # doctest: +SKIP
    deque([0.00042])
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from kvobs.adapters.api import AdapterSpec, Hook, Instrumentation, instrument
from kvobs.recorder import LinkRecorder, Recorder
from kvobs.tiers import GPU, HOST

COMPONENT = "vllm.offloading_worker"
MAX_JOBS_IN_FLIGHT = 65536


class TransferInstrumentation(Instrumentation):
    """Wrappers on one offloading worker.

    ``in_flight`` maps a submitted job id to ``(is_store, chunks, submitted_at)``;
    bounded, oldest forgotten first. ``unknown_jobs`` counts results of jobs submitted
    before the worker was instrumented.
    """

    def __init__(self, worker: Any, active: bool, rec: Recorder, counts: bool,
                 gpu_tier: str, tier: str) -> None:
        super().__init__(worker, COMPONENT, active, rec)
        self.in_flight: OrderedDict[int, tuple[bool, int, float]] = OrderedDict()
        self.unknown_jobs = 0
        self.counts = counts
        self._rec = rec
        self._directions = {True: (gpu_tier, tier), False: (tier, gpu_tier)}
        self._resolved: dict[bool, LinkRecorder] = {}

    def link(self, is_store: bool) -> LinkRecorder:
        """The link of a direction (store: gpu -> tier), resolved on first use."""
        link = self._resolved.get(is_store)
        if link is None:
            src, dst = self._directions[is_store]
            link = self._resolved[is_store] = self._rec.link(src, dst, counts=self.counts)
        return link

    def submitted(self, job_id: int, is_store: bool, chunks: int) -> None:
        """Remember a job the worker accepted."""
        in_flight = self.in_flight
        in_flight[job_id] = (is_store, chunks, time.perf_counter())
        if len(in_flight) > MAX_JOBS_IN_FLIGHT:
            in_flight.popitem(last=False)


def _chunks(spec: Any) -> int:
    """Blocks of the offload medium's side of a transfer (CPU chunks); a spec without
    ``block_ids`` (a release that moved it) raises, and the hook retires."""
    return len(spec.block_ids)


def _job_id(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    return int(args[0] if args else kwargs["job_id"])


def _submitted(store: bool) -> Callable[..., None]:
    """The reader of ``submit_store`` (``store``: chunks counted on the destination spec)
    or ``submit_load`` (on the source spec): track the job, or count a refused submit."""
    index, name = (2, "dst_spec") if store else (1, "src_spec")

    def read(inst: TransferInstrumentation, state: None, accepted: bool, *args: Any,
             **kwargs: Any) -> None:
        spec = args[index] if len(args) > index else kwargs[name]
        if accepted:
            inst.submitted(_job_id(args, kwargs), store, _chunks(spec))
        elif inst.counts:
            inst.link(store).fail(_chunks(spec))

    return read


def _finished(inst: TransferInstrumentation, state: None, results: Any) -> None:
    now = time.perf_counter()
    for result in results:
        job = inst.in_flight.pop(result.job_id, None)
        if job is None:
            inst.unknown_jobs += 1
            continue
        is_store, chunks, submitted_at = job
        link = inst.link(is_store)
        size = result.transfer_size or 0
        if not result.success:
            if inst.counts:
                link.fail(chunks, size)
            continue
        seconds = result.transfer_time
        if seconds is None:
            seconds = now - submitted_at
        if inst.counts:
            link.transfer(chunks, size, seconds)
        else:
            link.timed(seconds)


SPEC = AdapterSpec(COMPONENT, ("OffloadingWorker",), (
    Hook("submit_store", ("job_id",), "track", after=_submitted(True)),
    Hook("submit_load", ("job_id", "src_spec"), "track", after=_submitted(False)),
    Hook("get_finished", (), "transfer, fail", after=_finished),
))


def instrument_offloading_worker(worker: Any, rec: Recorder, *, gpu_tier: str = GPU,
                                 tier: str = HOST, counts: bool = False,
                                 ) -> TransferInstrumentation:
    """Time the transfers of a vLLM ``OffloadingWorker`` into ``rec``'s links.

    Args:
        worker: an ``OffloadingWorker`` (``CPUOffloadingWorker`` for CPU offloading),
            e.g. ``OffloadingConnectorWorker.worker`` of the worker-side connector.
        rec: the recorder of the worker process.
        gpu_tier: name of the GPU tier; ``tier`` the offload medium's tier.
        counts: also count operations, chunks and bytes here (False: per-shard
            durations only, the engine core counts the transfers).

    Example:
        >>> inst = instrument_offloading_worker(worker, Recorder())  # doctest: +SKIP
        >>> inst.unwrap()                                           # doctest: +SKIP

    Raises:
        AdapterError: not an OffloadingWorker, or already instrumented.
    """
    return instrument(worker, SPEC, lambda active: TransferInstrumentation(
        worker, active, rec, counts, gpu_tier, tier))
