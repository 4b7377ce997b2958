"""Zero-code enablement for SGLang: the ``kvobs`` entry point of ``sglang.srt.plugins``.

SGLang 0.5.23 loads its general plugins (``load_plugins()``) at the start of each of its
processes (in a scheduler process: ``run_scheduler_process``, before the ``Scheduler`` is
built), then applies the hooks they registered in its ``HookRegistry``; an ``AFTER``
hook runs as ``hook(result, self, *args)`` once the target returned, and whatever it
raises reaches SGLang. With ``KVOBS_ENABLE=1`` this plugin registers one ``AFTER`` hook
on ``Scheduler.__init__``; once a scheduler is built, in its own process, the hook makes
one recorder labelled with the process's ranks and instruments the scheduler's KV stack
(:mod:`kvobs.adapters.sglang`):

* ``scheduler.token_to_kv_pool_allocator`` with ``scheduler.tree_cache``: the ``gpu``
  tier, prefix hits, evictions, one lookup per admitted request (GPU / host hit tokens
  as SGLang splits ``cached_tokens``);
* with ``--enable-hierarchical-cache``, ``scheduler.tree_cache.cache_controller``: the
  ``host`` tier, backups (gpu->host), load-backs (host->gpu), refused backups.

Then it starts telemetry as the vLLM plugin does (:mod:`kvobs.adapters._plugin`: the
same ``KVOBS_*`` settings; ``/metrics``, OTLP push, the ``kv_cache_capacity`` and
periodic ``kv_cache_summary`` events) and logs ``kvobs_enabled`` with its URL::

    KVOBS_ENABLE=1 python -m sglang.launch_server --model-path Qwen/Qwen3-8B \\
        --enable-hierarchical-cache --tp 2

**One endpoint per scheduler process.** Every series carries ``tp_rank`` (and
``pp_rank`` with pipeline parallelism, ``dp_rank`` with a data-parallel controller); the
scheduler of ranks *(dp, pp, tp)* serves ``/metrics`` on ``PORT + (dp * pp_size + pp) *
tp_size + tp`` (``KVOBS_METRICS_ADDR``, default ``127.0.0.1:9464``), or the next free
port. TP ranks that run one batch (all of an engine's, without
``--enable-dp-attention``) each hold a shard of the KV heads: their token, page and
lookup counts are the same and their bytes are per shard; read one rank
(``tp_rank="0"``) for tokens, sum the ranks for bytes.

Never raises into SGLang: a failure while registering or instrumenting is logged once
(``kvobs_enable_failed``, ``kvobs_instrument_failed``, naming what failed) and the
scheduler runs uninstrumented; a host tier kvobs cannot instrument leaves the GPU tier
instrumented (``kvobs_instrument_partial``). The instrumentations are per instance and
kept here for the life of the process; :func:`disable` unwraps them and stops telemetry
(the OTLP exporter pushes a last export at process exit on its own).

Example:
    >>> from kvobs.adapters.sglang import plugin
    >>> plugin.register()                        # KVOBS_ENABLE=1: hooks Scheduler  # doctest: +SKIP
    >>> scheduler = Scheduler(server_args, port_args)                             # doctest: +SKIP
    >>> plugin.state().telemetry.metrics_url                                      # doctest: +SKIP
    'http://127.0.0.1:9464/metrics'
"""

from __future__ import annotations

import threading
from typing import Any

from kvobs.adapters import _plugin
from kvobs.adapters.api import AdapterError, Instrumentation
from kvobs.adapters.sglang.gpu import instrument_token_allocator
from kvobs.adapters.sglang.host import instrument_cache_controller
from kvobs.logs import get_logger
from kvobs.recorder import Recorder

_log = get_logger("kvobs.sglang")
#: What the hook is registered on, as SGLang's ``HookRegistry`` resolves it.
TARGET = "sglang.srt.managers.scheduler.Scheduler.__init__"
COMPONENT = "sglang.plugin"
UNINSTRUMENTED = "SGLang runs uninstrumented"


class _Enabled:
    """Process-wide state: the scheduler's recorder, telemetry and instrumentations."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.recorder: Recorder | None = None
        self.telemetry: Any = None
        self.instrumentations: list[Instrumentation] = []

    def attach(self, scheduler: Any) -> Recorder:
        """Instrument ``scheduler``'s KV stack and start serving its recorder."""
        labels, offset = _ranks()
        with self.lock:
            if self.recorder is not None:
                raise AdapterError(f"{COMPONENT}: a scheduler of this process is already "
                                   f"instrumented ({self.recorder.labels})")
            rec = Recorder(engine="sglang", model=_model_name(scheduler), labels=labels)
            parts: list[Instrumentation] = []
            try:
                parts.append(instrument_token_allocator(
                    scheduler.token_to_kv_pool_allocator, rec, tree_cache=scheduler.tree_cache))
                parts.extend(_instrument_host(scheduler, rec))
                self.telemetry = _plugin.start_telemetry(  # kvobs's events name the ranks
                    rec, _log.bind(**labels), offset, request_tokens=_request_tokens(scheduler))
            except BaseException:
                for part in reversed(parts):
                    part.unwrap()
                raise
            self.recorder, self.instrumentations = rec, parts
        return rec


_STATE = _Enabled()


def register() -> None:
    """The entry point SGLang's ``load_plugins()`` calls; a no-op unless
    ``KVOBS_ENABLE`` is set. Registers :func:`after_scheduler_init`. Never raises."""
    if not _plugin.enabled():
        return
    try:
        from sglang.srt.plugins.hook_registry import HookRegistry, HookType

        HookRegistry.register(TARGET, after_scheduler_init, HookType.AFTER)
    except Exception as exc:  # a broken kvobs must not stop SGLang from starting
        _log.warning("kvobs_enable_failed", engine="sglang", target=TARGET, error=repr(exc),
                     effect=UNINSTRUMENTED)


def after_scheduler_init(result: Any, scheduler: Any, *args: Any, **kwargs: Any) -> None:
    """The ``AFTER`` hook: SGLang calls ``hook(result, self, server_args, port_args)``
    once ``Scheduler.__init__`` returned. Returns None (``__init__``'s result stands);
    a failure is logged and the scheduler goes on uninstrumented."""
    try:
        _STATE.attach(scheduler)
    except Exception as exc:
        _log.warning("kvobs_instrument_failed", engine="sglang", target="Scheduler.__init__",
                     error=repr(exc), effect=UNINSTRUMENTED)


def disable() -> None:
    """Unwrap the instrumented objects and stop telemetry (the hook stays registered:
    a scheduler built later is instrumented again)."""
    with _STATE.lock:
        for part in reversed(_STATE.instrumentations):
            part.unwrap()
        _STATE.instrumentations.clear()
        if _STATE.telemetry is not None:
            _STATE.telemetry.close()
        _STATE.recorder = _STATE.telemetry = None


def state() -> _Enabled:
    """The process-wide plugin state (recorder, telemetry, instrumentations)."""
    return _STATE


def _instrument_host(scheduler: Any, rec: Recorder) -> list[Instrumentation]:
    """The HiCache controller's instrumentation, if the tree has one; a controller kvobs
    cannot instrument leaves the GPU tier instrumented, with one warning."""
    controller = getattr(scheduler.tree_cache, "cache_controller", None)
    if controller is None:
        return []
    try:
        return [instrument_cache_controller(controller, rec)]
    except AdapterError as exc:
        _log.warning("kvobs_instrument_partial", engine="sglang", missing="host tier",
                     error=str(exc), effect="the host tier, backups and load-backs are "
                                            "not counted; the GPU tier is")
        return []


def _ranks() -> tuple[dict[str, str], int]:
    """``(labels, port offset)`` of this scheduler process, from SGLang's published
    parallel context (a rank SGLang has not written reads as absent)."""
    from sglang.srt.runtime_context import get_parallel

    parallel = get_parallel()

    def read(name: str) -> int | None:
        try:
            value = getattr(parallel, name)
        except (AttributeError, RuntimeError, ValueError):
            return None
        return None if value is None else int(value)

    tp_rank, tp_size = read("tp_rank") or 0, read("tp_size") or 1
    pp_rank, pp_size = read("pp_rank") or 0, read("pp_size") or 1
    dp_rank = read("dp_rank")
    labels = {"tp_rank": str(tp_rank)}
    if pp_size > 1:
        labels["pp_rank"] = str(pp_rank)
    if dp_rank is not None:
        labels["dp_rank"] = str(dp_rank)
    return labels, ((dp_rank or 0) * pp_size + pp_rank) * tp_size + tp_rank


def _model_name(scheduler: Any) -> str:
    args = getattr(scheduler, "server_args", None)
    return _plugin.model_name(getattr(args, "served_model_name", None)
                              or getattr(args, "model_path", None)
                              or getattr(getattr(scheduler, "model_config", None),
                                         "model_path", None))


def _request_tokens(scheduler: Any) -> int:
    """The request length the capacity event reads capacity for: the context length."""
    context = getattr(getattr(scheduler, "model_config", None), "context_len", None)
    return int(context) if isinstance(context, int) and context > 0 else 8192
