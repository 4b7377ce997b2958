"""What kvobs's zero-code engine plugins share (vLLM's ``vllm.general_plugins``, SGLang's
``sglang.srt.plugins``): ``KVOBS_ENABLE``, the settings of the telemetry a plugin starts
in each engine process, the per-rank port, and the host's logging.

Settings are :class:`~kvobs.telemetry.settings.TelemetrySettings` read from the
environment when a plugin starts telemetry (so each engine process reads its own):
``KVOBS_METRICS_ADDR`` (base ``HOST:PORT``, default :data:`DEFAULT_ADDR`; a process
serves on ``PORT + port_offset``, its rank, or a later free port, :data:`PORT_ATTEMPTS`
in all; port 0 = any free port; empty = no endpoint), ``KVOBS_METRICS_MIN_INTERVAL_S``,
``KVOBS_OTLP_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_ENDPOINT``, ``OTEL_METRIC_EXPORT_INTERVAL``,
``KVOBS_SUMMARY_INTERVAL_S`` (default 60; 0 = off), ``KVOBS_LOG_FORMAT``,
``KVOBS_WEB_CONFIG_FILE``, ``KVOBS_TRACE_OUT`` / ``KVOBS_TRACE_MAX_BYTES``,
``KVOBS_MODEL`` (the ``model`` label; default: the engine's served model), and
``KVOBS_WORKER_METRICS`` (a worker process's own endpoint, opt-in).

Inside an engine a bad value never disables kvobs: it is ignored, the default is used,
and one ``kvobs_setting_ignored`` warning in the engine's log names the variable, the
value and the default. kvobs's events go through the standard ``logging`` module under
``kvobs.*`` (:mod:`kvobs.logs`); nothing is configured process-wide.

Example:
    >>> from kvobs.adapters import _plugin
    >>> _plugin.enabled()                                            # doctest: +SKIP
    True
    >>> telemetry = _plugin.start_telemetry(rec, log, port_offset=1)  # doctest: +SKIP
    >>> telemetry.metrics_url                                        # doctest: +SKIP
    'http://127.0.0.1:9465/metrics'
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from kvobs.telemetry.settings import DEFAULT_ADDR, TelemetrySettings

if TYPE_CHECKING:
    from kvobs.exporter import Telemetry
    from kvobs.recorder import Recorder

__all__ = ["DEFAULT_ADDR", "PORT_ATTEMPTS", "enabled", "model_name", "settings",
           "start_telemetry", "worker_metrics"]

TRUE = frozenset({"1", "true", "yes", "on"})
#: Ports tried, upwards from the preferred one, when it is taken.
PORT_ATTEMPTS = 64


def enabled() -> bool:
    """``KVOBS_ENABLE`` is set to a true value (``1``, ``true``, ``yes``, ``on``)."""
    return os.environ.get("KVOBS_ENABLE", "").strip().lower() in TRUE


def worker_metrics() -> bool:
    """``KVOBS_WORKER_METRICS`` is true: a worker process serves an endpoint of its own
    (per-shard device times; off by default, the engine's endpoint carries its transfers)."""
    return os.environ.get("KVOBS_WORKER_METRICS", "").strip().lower() in TRUE


def model_name(served: Any) -> str:
    """``KVOBS_MODEL`` if set, else the engine's served model (``"unknown"`` if none)."""
    return os.environ.get("KVOBS_MODEL", "").strip() or str(served or "unknown")


def settings(logger: Any, environ: Mapping[str, str] | None = None,
             host_logger: str | None = None) -> TelemetrySettings:
    """The telemetry settings of this engine process; an invalid variable is logged on
    ``logger`` (``kvobs_setting_ignored``, once the log format and the host's handlers
    are in place: see :func:`start_telemetry`'s ``host_logger``) and its default used."""
    from kvobs.logs import use_host_handlers

    ignored: list[dict[str, Any]] = []

    def note(variable: str, value: str, reason: str, default: Any) -> None:
        ignored.append({"variable": variable, "value": value, "error": reason,
                        "using": "none" if default is None else default})

    chosen = TelemetrySettings.from_env(environ, on_invalid=note, port_attempts=PORT_ATTEMPTS)
    use_host_handlers(host_logger, chosen.log_format)
    for fields in ignored:
        logger.warning("kvobs_setting_ignored", **fields)
    return chosen


def start_telemetry(rec: Recorder, logger: Any, port_offset: int, *,
                    request_tokens: int | None = None,
                    config: TelemetrySettings | None = None,
                    host_logger: str | None = None) -> Telemetry:
    """Start ``rec``'s telemetry as the settings say (see the module) and log
    ``kvobs_enabled`` with its URL; the host's logging set-up is left alone.

    Args:
        rec: the process's recorder.
        logger: logger for kvobs's events (:func:`kvobs.logs.get_logger`).
        port_offset: added to the base port (the process's rank).
        request_tokens: log the ``kv_cache_capacity`` event of ``rec``'s tiers for
            requests this long; None logs none.
        config: the process's settings (default: :func:`settings`, read now).
        host_logger: the engine's logger namespace (``"vllm"``) whose handlers kvobs's
            events share when nothing handles the ``kvobs`` logger
            (:func:`kvobs.logs.use_host_handlers`).

    Raises:
        ConfigError: no free port, or a file named by a setting is unusable (one line,
            which the plugin logs before the engine goes on uninstrumented).
    """
    from dataclasses import replace

    from kvobs.exporter import start_telemetry as start
    from kvobs.logs import use_host_handlers
    from kvobs.telemetry.address import shift_port

    chosen = config if config is not None else settings(logger, host_logger=host_logger)
    use_host_handlers(host_logger, chosen.log_format)
    if chosen.metrics_addr:
        chosen = replace(chosen, metrics_addr=shift_port(chosen.metrics_addr, port_offset))
    telemetry = start(rec, logs=None, log_capacity=request_tokens is not None,
                      request_tokens=request_tokens or 8192, logger=logger, settings=chosen)
    logger.info("kvobs_enabled", engine=rec.engine, model=rec.model,
                metrics_url=telemetry.metrics_url, otlp_endpoint=chosen.otlp_endpoint,
                **rec.labels)
    return telemetry
