"""Zero-code enablement for vLLM: the ``kvobs`` entry point of ``vllm.general_plugins``.

vLLM calls every general plugin in every process it starts (API server, each
engine-core process, each GPU worker). With ``KVOBS_ENABLE=1`` this one installs two
constructor-time hooks and, in each process where one fires, starts telemetry through
:meth:`kvobs.exporter.Telemetry.start` (``/metrics``, OTLP push, NVML, the periodic
``kv_cache_summary`` log)::

    KVOBS_ENABLE=1 KVOBS_METRICS_ADDR=0.0.0.0:9464 \\
        vllm serve meta-llama/Llama-3.1-8B-Instruct --kv-offloading-size 64

* **Engine core** (``Scheduler.__init__``): the scheduler's ``KVCacheManager``,
  ``BlockPool`` and lookups (the ``gpu`` tier), the offloading connector's CPU manager
  (``host``) and, with ``spec_name: TieringOffloadingSpec``, its secondary tiers
  (``disk`` / ``remote``, :mod:`kvobs.adapters.vllm.tiering`; the host tier is then the
  tiering manager's CPU primary tier). Transfers are counted here, from the worker
  metadata the scheduler receives; host / disk hits are split as vLLM's
  ``hits_by_source``; each lookup's block hashes feed the reuse-distance profile (and
  ``KVOBS_TRACE_OUT``); each step's time and prefill / decode tokens give the measured
  prefill cost (:mod:`kvobs.adapters.vllm.steps`). One ``kv_cache_capacity`` event lists
  every tier.
  The workers' transfer times reach it through vLLM's own worker-to-scheduler channel
  (``OffloadingWorkerMetadata.transfer_stats``), so this one endpoint carries the
  transfer-duration histogram too (:mod:`kvobs.adapters.vllm.connector`).
* **GPU worker**, only with ``KVOBS_WORKER_METRICS=1`` and a worker process of its own
  (``OffloadingConnectorWorker.register_kv_caches``, where the worker builds its
  ``OffloadingWorker``): each shard's device time, timed by vLLM on the copy stream, as
  ``kvobs_transfer_shard_duration_seconds`` on its own endpoint
  (:mod:`kvobs.adapters.vllm.transfers`): no transfer counters and no
  ``kvobs_transfer_duration_seconds``, so nothing is counted twice.

(``--kv-offloading-size`` GiB turns on vLLM's native CPU offloading; without it only the
GPU tier and lookups are instrumented.)

**One endpoint per engine.** Every series carries ``dp_rank`` (vLLM's data-parallel rank
of the engine): the engine core of data-parallel rank *r* serves ``/metrics`` on
``PORT + r``; a port taken by another process moves to the next free one, and the
process logs its URL (``metrics_serving``). Scrape one target per engine (per
data-parallel rank), or set ``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``KVOBS_OTLP_ENDPOINT``
to push. The opt-in worker endpoints (``KVOBS_WORKER_METRICS=1``) add ``tp_rank`` and
serve on ``PORT + 100 + r * world_size + t`` for worker *t*.

Settings: ``KVOBS_METRICS_ADDR`` (base ``HOST:PORT``, default ``127.0.0.1:9464``; port 0
= any free port; empty = no endpoint), ``KVOBS_OTLP_ENDPOINT`` (push as well; default
``OTEL_EXPORTER_OTLP_ENDPOINT``), ``KVOBS_SUMMARY_INTERVAL_S`` (default 60; 0 = off),
``KVOBS_MODEL`` (the ``model`` label; default: the served model), ``KVOBS_LOG_FORMAT``
(``json``: each kvobs event's message is a JSON object; default ``event key=value``;
either way through the standard ``logging`` module under ``kvobs.vllm``, with vLLM's
handlers and format unless the ``kvobs`` logger is configured), ``KVOBS_TRACE_OUT``
(trace the prefix lookups' block hashes for ``kvobs whatif``; ``KVOBS_TRACE_MAX_BYTES``
bounds the file, default 256 MiB), ``KVOBS_PREFILL_SECONDS_PER_TOKEN`` (a configured
prefill cost until kvobs measures one); a value that does not parse is ignored with one
``kvobs_setting_ignored`` warning naming it (:mod:`kvobs.telemetry.settings`). Without
``KVOBS_ENABLE`` the plugin does nothing. kvobs never raises into vLLM: a failure
while enabling or instrumenting is logged (``kvobs_enable_failed``,
``kvobs_instrument_failed``) and vLLM goes on uninstrumented.

Why kvobs serves its own endpoints instead of joining vLLM's Prometheus registry: the
block pool and the offloading manager live in the engine-core process and the copy
streams in the workers, while vLLM's ``/metrics`` is served by the API-server process
from stats the engine core sends over ZMQ as fixed dataclasses. Nothing kvobs adds there
would reach that registry, so kvobs serves its metrics from the processes that own the
counters.

The only class-level touches are the two constructor-time hooks (there is no instance
before they run) and one on ``OffloadingSpecFactory.create_spec``, which keeps the spec
vLLM builds until its scheduler is instrumented (vLLM 0.32 publishes the host tier's
bytes per chunk only there); the instrumentation itself is per instance, and
:func:`disable` removes the hooks, unwraps every instance and stops telemetry.

Example:
    >>> from kvobs.adapters.vllm import plugin
    >>> state = plugin.enable()                      # doctest: +SKIP
    >>> scheduler = Scheduler(vllm_config, ...)      # doctest: +SKIP
    >>> state.telemetry.metrics_url                  # doctest: +SKIP
    'http://127.0.0.1:9464/metrics'
    >>> plugin.disable()                             # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import threading
import weakref
from collections.abc import Callable
from typing import Any

from kvobs.adapters import _plugin, gate
from kvobs.adapters.api import Instrumentation
from kvobs.adapters.vllm.manager import VllmInstrumentation, instrument_scheduler
from kvobs.adapters.vllm.tiering import TieringInstrumentation, instrument_tiering, tiering_manager
from kvobs.adapters.vllm.transfers import TransferInstrumentation, instrument_offloading_worker
from kvobs.logs import get_logger
from kvobs.recorder import Recorder
from kvobs.telemetry.settings import TelemetrySettings

_log = get_logger("kvobs.vllm")
DEFAULT_ADDR = _plugin.DEFAULT_ADDR
HOOK_FLAG = "_kvobs_scheduler_hook"
WORKER_HOOK_FLAG = "_kvobs_worker_hook"
SPEC_HOOK_FLAG = "_kvobs_spec_hook"
#: Worker endpoints start this many ports above the base port.
WORKER_PORT_OFFSET = 100
PORT_ATTEMPTS = _plugin.PORT_ATTEMPTS

Part = VllmInstrumentation | TieringInstrumentation | TransferInstrumentation


class _Enabled:
    """Process-wide state: one recorder and one telemetry for every instance it holds."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.recorder: Recorder | None = None
        self.telemetry: Any = None
        self.instrumentations: list[Part] = []
        self.hooks: list[tuple[type, str, Any]] = []  # (class, method, original)
        #: connector scheduler side -> the offloading spec it was built from
        self.specs: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()

    @property
    def schedulers(self) -> int:
        """Schedulers instrumented in this process."""
        with self.lock:
            return sum(isinstance(inst, VllmInstrumentation) for inst in self.instrumentations)

    @property
    def server(self) -> Any:
        """The ``/metrics`` server of this process (None when not serving)."""
        return getattr(self.telemetry, "server", None)

    def _recorder(self, model: str, labels: dict[str, str], port_offset: int) -> Recorder:
        """The process's recorder; the first call creates it and starts telemetry."""
        if self.recorder is None:
            rec = Recorder(engine="vllm", model=model, labels=labels)
            rec.add_source(gate.info_source("vllm", self.parts))
            settings = _plugin.settings(_log, host_logger="vllm")
            if "tp_rank" in labels:  # a worker's opt-in endpoint: no tiers to summarise
                settings = dataclasses.replace(settings, summary_interval_s=0)
            self.telemetry = _plugin.start_telemetry(rec, _log, port_offset, config=settings,
                                                     host_logger="vllm")
            _open_trace(rec, labels, settings)
            self.recorder = rec
        return self.recorder

    def attach(self, scheduler: Any) -> VllmInstrumentation:
        """Instrument one scheduler (and its tiering); log every tier's capacity."""
        dp_rank = _dp_rank(getattr(scheduler, "vllm_config", None))
        with self.lock:
            rec = self._recorder(_model_name(getattr(scheduler, "vllm_config", None)),
                                 {"dp_rank": str(dp_rank)}, dp_rank)
            inst = instrument_scheduler(scheduler, rec, offloading_spec=self.spec_of(scheduler))
            self.instrumentations.append(inst)
            tiering = _attach_tiering(scheduler, rec, inst)
            if tiering is not None:
                self.instrumentations.append(tiering)
            parts = [*inst.parts, *(tiering.parts if tiering is not None else ())]
        gate.log_instrumented(_log, "vllm", parts, **rec.labels)
        _log_capacity(scheduler, rec, inst)
        return inst

    def parts(self) -> list[Instrumentation]:
        """Every instrumented part of every engine object in this process."""
        with self.lock:
            return [part for inst in self.instrumentations for part in
                    (inst.parts if hasattr(inst, "parts") else (inst,))]

    def remember_spec(self, side: Any, spec: Any, *args: Any, **kwargs: Any) -> None:
        """Keep the offloading spec a connector's scheduler side was built from until its
        scheduler is instrumented: the side does not keep it, and it is where vLLM 0.32
        publishes the host tier's chunks and bytes per chunk (held weakly, per side)."""
        with self.lock:
            self.specs[side] = spec

    def spec_of(self, scheduler: Any) -> Any:
        """The offloading spec ``scheduler``'s connector was built from (then forgotten),
        or None."""
        side = getattr(getattr(scheduler, "connector", None), "connector_scheduler", None)
        if side is None:
            return None
        with self.lock:
            return self.specs.pop(side, None)

    def attach_worker(self, connector_worker: Any) -> TransferInstrumentation | None:
        """With ``KVOBS_WORKER_METRICS``, time each shard of the transfers of a worker
        process's ``OffloadingWorker`` on an endpoint of its own; otherwise nothing (the
        engine core reads the workers' times from vLLM's channel)."""
        config = getattr(connector_worker, "vllm_config", None)
        same_process = getattr(getattr(config, "parallel_config", None),
                               "distributed_executor_backend", None) == "uni"
        if same_process or not _plugin.worker_metrics():
            return None
        parallel = connector_worker.spec.config.parallel
        dp_rank, rank = _dp_rank(config), int(parallel.rank)
        labels = {"dp_rank": str(dp_rank), "tp_rank": str(rank)}
        offset = WORKER_PORT_OFFSET + dp_rank * int(parallel.world_size) + rank
        with self.lock:
            rec = self._recorder(_model_name(config), labels, offset)
            inst = instrument_offloading_worker(connector_worker.worker, rec)
            self.instrumentations.append(inst)
        gate.log_instrumented(_log, "vllm", [inst], **labels)
        return inst


_STATE = _Enabled()


def _open_trace(rec: Recorder, labels: dict[str, str], settings: TelemetrySettings) -> None:
    """``KVOBS_TRACE_OUT=PATH``: trace the prefix lookups for ``kvobs whatif`` (hashes only;
    ``KVOBS_TRACE_MAX_BYTES``, default 256 MiB). Ranks above 0 append ``.dp<rank>``;
    worker processes, which look nothing up, write no trace."""
    path = settings.trace_out
    if not path or "tp_rank" in labels:
        return
    if labels.get("dp_rank", "0") != "0":
        path = f"{path}.dp{labels['dp_rank']}"
    writer = rec.open_trace(path, settings.trace_max_bytes)
    _log.info("kvobs_tracing_lookups", path=path, max_bytes=writer.max_bytes, **labels)


def _attach_tiering(scheduler: Any, rec: Recorder,
                    inst: VllmInstrumentation) -> TieringInstrumentation | None:
    manager = tiering_manager(scheduler)
    if manager is None:
        return None
    side = scheduler.connector.connector_scheduler
    tokens = int(side.config.kv_group_configs[0].tokens_per_chunk)
    tiering = instrument_tiering(manager, rec, block_tokens=tokens)
    for part in inst.parts:  # the lookup adapter records the disk hits it leaves
        if part.component == "vllm.kv_cache_manager":
            part.disk_hits = tiering.disk_hits  # type: ignore[attr-defined]
    return tiering


def register() -> None:
    """The entry point vLLM calls; a no-op unless ``KVOBS_ENABLE`` is set. Never raises."""
    if not _plugin.enabled():
        return
    try:
        enable()
    except Exception as exc:  # a broken kvobs must not stop vLLM from starting
        _log.warning("kvobs_enable_failed", error=repr(exc))


def _hook(cls: type, name: str, flag: str, then: Callable[..., Any], *,
          with_args: bool = False) -> None:
    """Wrap ``cls.name`` so that ``then(self)`` (``then(self, *args, **kwargs)`` with
    ``with_args``) runs after it, guarded."""
    original = getattr(cls, name)
    if getattr(original, flag, False):
        return

    @functools.wraps(original)
    def run_then_instrument(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        try:
            if with_args:
                then(self, *args, **kwargs)
            else:
                then(self)
        except Exception as exc:  # vLLM goes on uninstrumented
            _log.warning("kvobs_instrument_failed", target=cls.__name__, error=repr(exc))
            if _STATE.recorder is not None:
                _STATE.recorder.error("vllm.plugin", exc)
        return result

    setattr(run_then_instrument, flag, True)
    _STATE.hooks.append((cls, name, original))
    setattr(cls, name, run_then_instrument)


def enable() -> _Enabled:
    """Hook ``Scheduler.__init__`` and ``OffloadingConnectorWorker.register_kv_caches``
    so that new schedulers and offloading workers get instrumented, and
    ``OffloadingConnectorScheduler.__init__`` so that the host tier's size is known where
    the offloading manager does not publish it (idempotent)."""
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.scheduler import (
        OffloadingConnectorScheduler,
    )
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.worker import (
        OffloadingConnectorWorker,
    )
    from vllm.v1.core.sched.scheduler import Scheduler  # vLLM is optional
    with _STATE.lock:
        _hook(Scheduler, "__init__", HOOK_FLAG, _STATE.attach)
        _hook(OffloadingConnectorWorker, "register_kv_caches", WORKER_HOOK_FLAG,
              _STATE.attach_worker)
        _hook(OffloadingConnectorScheduler, "__init__", SPEC_HOOK_FLAG, _STATE.remember_spec,
              with_args=True)
    return _STATE


def disable() -> None:
    """Remove the hooks, unwrap every instrumented object, stop telemetry."""
    with _STATE.lock:
        for cls, name, original in reversed(_STATE.hooks):
            setattr(cls, name, original)
        _STATE.hooks.clear()
        _STATE.specs.clear()
        for inst in reversed(_STATE.instrumentations):
            inst.unwrap()
        _STATE.instrumentations.clear()
        if _STATE.telemetry is not None:
            _STATE.telemetry.close()
        _STATE.recorder = _STATE.telemetry = None


def state() -> _Enabled:
    """The process-wide plugin state (recorder, telemetry, instrumentations)."""
    return _STATE


def _dp_rank(vllm_config: Any) -> int:
    """The engine's data-parallel rank: ``data_parallel_index`` where vLLM sets it, else
    ``data_parallel_rank``. A dense model's DP ranks are independent engines, and vLLM
    resets each one's ``data_parallel_rank`` to 0 (``reconfigure_for_independent_dp_rank``)
    keeping the rank in ``data_parallel_index`` only: read alone, ``data_parallel_rank``
    gave every rank ``dp_rank="0"`` and the ports of rank 0, taken by whichever rank
    bound first."""
    parallel = getattr(vllm_config, "parallel_config", None)
    index = getattr(parallel, "data_parallel_index", None)
    return int(index or getattr(parallel, "data_parallel_rank", 0) or 0)


def _model_name(vllm_config: Any) -> str:
    model_config = getattr(vllm_config, "model_config", None)
    return _plugin.model_name(getattr(model_config, "served_model_name", None)
                              or getattr(model_config, "model", None))


def _log_capacity(scheduler: Any, rec: Recorder, inst: VllmInstrumentation) -> None:
    """One ``kv_cache_capacity`` event listing every tier (GPU, host, disk...), never added
    up, and the same as one human line in vLLM's own log, after vLLM's "GPU KV cache
    size" line (which counts the GPU tier alone, its null block included). A tier kvobs
    cannot read on this release is named unreadable, with the reason, in both."""
    from kvobs.capacity import CapacityPlan
    from kvobs.telemetry.logs import capacity_line

    release = gate.release("vllm")[0]
    unreadable = {state.part.removesuffix("_tier"): f"unreadable on vLLM {release}: {state.why}"
                  for state in gate.part_states(inst.parts)
                  if state.part in ("gpu_tier", "host_tier") and not state.on}

    model_config = getattr(getattr(scheduler, "vllm_config", None), "model_config", None)
    request_tokens = int(getattr(model_config, "max_model_len", 0) or 8192)
    gpu = rec.tier("gpu") if "gpu" in rec.tier_names else None
    per_token = gpu.block_bytes // gpu.block_tokens if gpu and gpu.block_tokens else 0
    plan = CapacityPlan.from_recorder(rec, request_tokens=request_tokens,
                                      bytes_per_token=per_token)
    _log.info("kv_cache_capacity", engine="vllm", **plan.as_event(), **rec.labels,
              note=_capacity_note(plan), **({"unreadable": unreadable} if unreadable else {}))
    _vllm_logger().info("%s", capacity_line(plan, unreadable))


def _capacity_note(plan: Any) -> str:
    """What the tiers mean for requests, in words, from their roles."""
    from kvobs.tiers import CACHE, PRIMARY

    primary = [t.tier for t in plan.tiers if t.role == PRIMARY]
    caches = [t.tier for t in plan.tiers if t.role == CACHE]
    if len(primary) > 1:
        note = (f"running requests need blocks in the {' and '.join(primary)} tiers "
                f"(the smaller limit, {plan.bounded_by}, bounds concurrency)")
    else:
        note = f"the {primary[0].upper() if primary else 'GPU'} tier bounds running requests"
    if len(caches) > 1:
        note += f"; the {' and '.join(caches)} tiers keep reusable prefixes"
    elif caches:
        note += f"; the {caches[0]} tier keeps reusable prefixes"
    return note + (" that are onloaded before use" if caches else "")


def _vllm_logger() -> logging.Logger:
    """A logger under vLLM's namespace: its lines share vLLM's format and destination."""
    return logging.getLogger("vllm.kvobs")
