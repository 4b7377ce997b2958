"""vLLM 0.33 ``OffloadingWorker`` (worker side of offloading) -> transfer metrics.

``submit_store(job_id, src_spec, dst_spec)`` moves GPU blocks to the offload medium and
``submit_load(job_id, src_spec, dst_spec)`` moves them back; ``get_finished()`` returns one
``TransferResult(job_id, success, transfer_size, transfer_time)`` per job. The adapter
remembers each submitted job's direction and GPU block count (a bounded map of jobs in
flight) and turns every result into ``link.completed`` / ``link.failed``.

``transfer_time`` is what vLLM's CPU worker measures between two CUDA events on the copy
stream, i.e. device time; when a worker reports none, the wall time from submission to
the ``get_finished`` that returned the job is used instead (an upper bound).

Example:
    >>> inst = instrument_offloading_worker(worker, rec)   # doctest: +SKIP
    >>> rec.link("gpu", "host").snapshot().bytes          # doctest: +SKIP
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Any

from kvobs.adapters._hooks import Hook, Instrumentation, begin
from kvobs.recorder import LinkRecorder, Recorder
from kvobs.tiers import GPU, HOST

COMPONENT = "vllm.offloading_worker"
HOOKS = (
    Hook("submit_store", ("job_id", "src_spec", "dst_spec")),
    Hook("submit_load", ("job_id", "src_spec", "dst_spec")),
    Hook("get_finished", ()),
)
MAX_JOBS_IN_FLIGHT = 65536


class TransferInstrumentation(Instrumentation):
    """Wrappers on one offloading worker; ``in_flight`` maps job id -> (link, blocks, t0)."""

    def __init__(self, worker: Any, active: bool) -> None:
        super().__init__(worker, COMPONENT, active)
        self.in_flight: OrderedDict[int, tuple[LinkRecorder, int, float]] = OrderedDict()
        self.unknown_jobs = 0  # results for jobs submitted before instrumenting


def _gpu_blocks(spec: Any) -> int:
    """GPU blocks of a ``GPULoadStoreSpec`` (``block_ids`` is a numpy array)."""
    return len(spec.block_ids)


def instrument_offloading_worker(worker: Any, rec: Recorder, *, gpu_tier: str = GPU,
                                 tier: str = HOST) -> TransferInstrumentation:
    """Count the transfers of a vLLM ``OffloadingWorker`` into ``rec``'s links.

    Args:
        worker: an ``OffloadingWorker`` (``CPUOffloadingWorker`` for CPU offloading).
        rec: the recorder.
        gpu_tier: name of the GPU tier; ``tier`` the offload medium's tier.

    Raises:
        AdapterError: not an OffloadingWorker, or already instrumented.
    """
    inst = begin(worker, ("OffloadingWorker",), HOOKS, COMPONENT,
                 lambda active: TransferInstrumentation(worker, active))
    if inst.active:
        _install(inst, worker, rec, rec.link(gpu_tier, tier), rec.link(tier, gpu_tier))
    return inst


def _install(inst: TransferInstrumentation, worker: Any, rec: Recorder,
             offload: LinkRecorder, onload: LinkRecorder) -> None:
    submit_store, submit_load = worker.submit_store, worker.submit_load
    get_finished = worker.get_finished
    in_flight, error = inst.in_flight, rec.error

    def track(job_id: int, link: LinkRecorder, gpu_spec: Any, accepted: bool) -> None:
        try:
            blocks = _gpu_blocks(gpu_spec)
            if not accepted:
                link.failed(blocks)
                return
            in_flight[job_id] = (link, blocks, time.perf_counter())
            if len(in_flight) > MAX_JOBS_IN_FLIGHT:
                in_flight.popitem(last=False)
        except Exception as exc:
            error(COMPONENT, exc)

    def submit_store_hook(job_id: int, src_spec: Any, dst_spec: Any, *args: Any,
                          **kwargs: Any) -> bool:
        accepted: bool = submit_store(job_id, src_spec, dst_spec, *args, **kwargs)
        track(job_id, offload, src_spec, accepted)
        return accepted

    def submit_load_hook(job_id: int, src_spec: Any, dst_spec: Any, *args: Any,
                         **kwargs: Any) -> bool:
        accepted: bool = submit_load(job_id, src_spec, dst_spec, *args, **kwargs)
        track(job_id, onload, dst_spec, accepted)
        return accepted

    def get_finished_hook() -> Any:
        results = get_finished()
        try:
            now = time.perf_counter()
            for result in results:
                job = in_flight.pop(result.job_id, None)
                if job is None:
                    inst.unknown_jobs += 1
                    continue
                link, blocks, started = job
                if not result.success:
                    link.failed(blocks, result.transfer_size or 0)
                    continue
                seconds = result.transfer_time
                if seconds is None:
                    seconds = now - started
                link.completed(blocks, result.transfer_size or 0, seconds)
        except Exception as exc:
            error(COMPONENT, exc)
        return results

    inst.install("submit_store", submit_store_hook)
    inst.install("submit_load", submit_load_hook)
    inst.install("get_finished", get_finished_hook)
