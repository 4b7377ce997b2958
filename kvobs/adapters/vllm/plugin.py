"""Zero-code enablement for vLLM: the ``kvobs`` entry point of ``vllm.general_plugins``.

vLLM calls every general plugin in every process it starts. With ``KVOBS_ENABLE=1``
this one arranges for each v1 ``Scheduler`` the process builds to be instrumented
(its ``KVCacheManager``, ``BlockPool`` and, with the offloading connector, the
``CPUOffloadingManager``), logs the tier capacities, and serves ``/metrics``::

    KVOBS_ENABLE=1 KVOBS_METRICS_ADDR=0.0.0.0:9464 \\
        vllm serve meta-llama/Llama-3.1-8B-Instruct --kv-offloading-size 64

(``--kv-offloading-size`` GiB turns on vLLM's native CPU offloading: the
``OffloadingConnector`` with a ``CPUOffloadingManager``; without it only the GPU tier
and lookups are instrumented.)

Settings: ``KVOBS_METRICS_ADDR`` (default ``127.0.0.1:9464``; empty = no endpoint),
``KVOBS_OTLP_ENDPOINT`` (push as well), ``KVOBS_MODEL`` (the ``model`` label; default:
the served model). Without ``KVOBS_ENABLE`` the plugin does nothing.

Why kvobs serves its own endpoint instead of joining vLLM's Prometheus registry: the
block pool and the offloading manager live in the engine-core process, while vLLM's
``/metrics`` is served by the API-server process from stats the engine core sends over
ZMQ as fixed dataclasses. Nothing kvobs adds there would reach that registry, so kvobs
serves its metrics from the process that owns the counters (scrape both targets).

The only class-level touch is one constructor hook on ``Scheduler.__init__`` (there is
no instance before it runs); the instrumentation itself is per instance, and
:func:`disable` removes the hook and unwraps every scheduler.
"""

from __future__ import annotations

import functools
import os
import threading
from typing import Any

import structlog

from kvobs.adapters.vllm.capacity import gpu_tier_capacity
from kvobs.adapters.vllm.manager import VllmInstrumentation, instrument_scheduler
from kvobs.recorder import Recorder

_log = structlog.get_logger("kvobs.vllm")
_TRUE = {"1", "true", "yes", "on"}
DEFAULT_ADDR = "127.0.0.1:9464"
HOOK_FLAG = "_kvobs_scheduler_hook"


class _Enabled:
    """Process-wide state: one recorder and endpoint for every scheduler of the process."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.recorder: Recorder | None = None
        self.server: Any = None
        self.bridge: Any = None
        self.instrumentations: list[VllmInstrumentation] = []
        self.original_init: Any = None

    def attach(self, scheduler: Any) -> VllmInstrumentation:
        """Instrument one scheduler; start the endpoint with the first one."""
        with self.lock:
            if self.recorder is None:
                self.recorder = Recorder(engine="vllm", model=_model_name(scheduler))
                self._serve(self.recorder)
            inst = instrument_scheduler(scheduler, self.recorder)
            self.instrumentations.append(inst)
        _log_capacity(scheduler, self.recorder)
        return inst

    def _serve(self, rec: Recorder) -> None:
        from kvobs.telemetry.otel import OtelBridge  # only when enabled
        from kvobs.telemetry.otlp import otlp_reader
        from kvobs.telemetry.prometheus import start_metrics_server

        readers = []
        address = os.environ.get("KVOBS_METRICS_ADDR", DEFAULT_ADDR).strip()
        if address:
            self.server = start_metrics_server(address)
            readers.append(self.server.reader)
        endpoint = os.environ.get("KVOBS_OTLP_ENDPOINT", "").strip()
        if endpoint:
            readers.append(otlp_reader(endpoint, rec))
        if readers:
            self.bridge = OtelBridge(rec, readers)
        _log.info("kvobs_enabled", engine="vllm", model=rec.model,
                  metrics_url=getattr(self.server, "url", None), otlp_endpoint=endpoint or None)


_STATE = _Enabled()


def register() -> None:
    """The entry point vLLM calls; a no-op unless ``KVOBS_ENABLE`` is set. Never raises."""
    if os.environ.get("KVOBS_ENABLE", "").strip().lower() not in _TRUE:
        return
    try:
        enable()
    except Exception as exc:  # a broken kvobs must not stop vLLM from starting
        _log.warning("kvobs_enable_failed", error=repr(exc))


def enable() -> _Enabled:
    """Hook ``Scheduler.__init__`` so new schedulers get instrumented (idempotent)."""
    from vllm.v1.core.sched.scheduler import Scheduler  # vLLM is optional

    original = Scheduler.__init__
    if getattr(original, HOOK_FLAG, False):
        return _STATE

    @functools.wraps(original)
    def init_then_instrument(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        try:
            _STATE.attach(self)
        except Exception as exc:
            _log.warning("kvobs_instrument_failed", error=repr(exc))

    setattr(init_then_instrument, HOOK_FLAG, True)
    _STATE.original_init = original
    setattr(Scheduler, "__init__", init_then_instrument)  # noqa: B010 - mypy-neutral
    return _STATE


def disable() -> None:
    """Remove the constructor hook, unwrap every scheduler, stop the endpoint."""
    from vllm.v1.core.sched.scheduler import Scheduler

    with _STATE.lock:
        if _STATE.original_init is not None:
            setattr(Scheduler, "__init__", _STATE.original_init)  # noqa: B010
            _STATE.original_init = None
        for inst in _STATE.instrumentations:
            inst.unwrap()
        _STATE.instrumentations.clear()
        if _STATE.bridge is not None:
            _STATE.bridge.shutdown()
        if _STATE.server is not None:
            _STATE.server.close()
        _STATE.recorder = _STATE.server = _STATE.bridge = None


def state() -> _Enabled:
    """The process-wide plugin state (recorder, endpoint, instrumentations)."""
    return _STATE


def _model_name(scheduler: Any) -> str:
    configured = os.environ.get("KVOBS_MODEL", "").strip()
    if configured:
        return configured
    model_config = getattr(getattr(scheduler, "vllm_config", None), "model_config", None)
    return str(getattr(model_config, "served_model_name", None)
               or getattr(model_config, "model", None) or "unknown")


def _log_capacity(scheduler: Any, rec: Recorder) -> None:
    """One ``kv_cache_capacity`` event: GPU and host tiers, never added together."""
    try:
        manager = scheduler.kv_cache_manager
        gpu = gpu_tier_capacity(manager.kv_cache_config)
        tiers = {t.name: {"blocks": t.capacity_blocks, "tokens": t.capacity_blocks * t.block_tokens,
                          "bytes": t.capacity_blocks * t.block_bytes}
                 for t in (rec.tier(name) for name in rec.tier_names)}
        _log.info("kv_cache_capacity", engine="vllm", model=rec.model,
                  gpu_block_tokens=gpu.block_tokens, tiers=tiers,
                  note="the GPU tier bounds running requests; the host tier keeps reusable "
                       "prefixes that are onloaded before use")
    except Exception as exc:
        rec.error("vllm.plugin", exc)
