"""What kvobs's zero-code engine plugins share (vLLM's ``vllm.general_plugins``, SGLang's
``sglang.srt.plugins``): ``KVOBS_ENABLE``, the ``KVOBS_*`` settings of the telemetry a
plugin starts in each engine process, and the per-rank port.

Settings (read when a plugin starts telemetry, so each engine process reads its own):

* ``KVOBS_METRICS_ADDR``: base ``HOST:PORT`` of ``/metrics`` (default
  :data:`DEFAULT_ADDR`); a process serves on ``PORT + port_offset`` (its rank), or a
  later free port (:data:`PORT_ATTEMPTS` in all); port 0 = any free port; empty = no
  endpoint.
* ``KVOBS_OTLP_ENDPOINT``: OTLP/HTTP push (default ``OTEL_EXPORTER_OTLP_ENDPOINT``).
* ``KVOBS_SUMMARY_INTERVAL_S``: seconds between ``kv_cache_summary`` events (0 = off).
* ``KVOBS_LOG_FORMAT``: ``json`` / ``console`` rendering of kvobs's own events.
* ``KVOBS_MODEL``: the ``model`` label (default: the engine's served model).

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
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvobs.exporter import Telemetry
    from kvobs.recorder import Recorder

TRUE = frozenset({"1", "true", "yes", "on"})
DEFAULT_ADDR = "127.0.0.1:9464"
#: Ports tried, upwards from the preferred one, when it is taken.
PORT_ATTEMPTS = 64
SUMMARY_INTERVAL_S = 60.0


def enabled() -> bool:
    """``KVOBS_ENABLE`` is set to a true value (``1``, ``true``, ``yes``, ``on``)."""
    return os.environ.get("KVOBS_ENABLE", "").strip().lower() in TRUE


def model_name(served: Any) -> str:
    """``KVOBS_MODEL`` if set, else the engine's served model (``"unknown"`` if none)."""
    return os.environ.get("KVOBS_MODEL", "").strip() or str(served or "unknown")


def metrics_address(port_offset: int) -> str | None:
    """``KVOBS_METRICS_ADDR`` (default :data:`DEFAULT_ADDR`) with its port moved up by
    ``port_offset`` (port 0 stays 0); None when it is set empty."""
    from kvobs.telemetry.prometheus import parse_address

    address = os.environ.get("KVOBS_METRICS_ADDR", DEFAULT_ADDR).strip() or None
    if address is None:
        return None
    host, port = parse_address(address, "KVOBS_METRICS_ADDR")
    if not port:
        return address
    host = f"[{host}]" if ":" in host else host
    return f"{host}:{min(port + port_offset, 65535)}"


def start_telemetry(rec: Recorder, logger: Any, port_offset: int, *,
                    request_tokens: int | None = None) -> Telemetry:
    """Start ``rec``'s telemetry as the ``KVOBS_*`` settings say (see the module) and
    log ``kvobs_enabled`` with its URL; the host's logging set-up is left alone.

    Args:
        rec: the process's recorder.
        logger: structlog logger for kvobs's events.
        port_offset: added to the base port (the process's rank).
        request_tokens: log the ``kv_cache_capacity`` event of ``rec``'s tiers for
            requests this long; None logs none.

    Raises:
        ConfigError: an invalid setting, or no free port.
    """
    from kvobs import start_telemetry as start

    log_format = os.environ.get("KVOBS_LOG_FORMAT", "").strip()
    if log_format:  # kvobs's own events only: the engine logs through the logging module
        from kvobs.telemetry.logs import configure_logging

        configure_logging(log_format)
    endpoint = os.environ.get("KVOBS_OTLP_ENDPOINT", "").strip() or None
    interval = float(os.environ.get("KVOBS_SUMMARY_INTERVAL_S", SUMMARY_INTERVAL_S) or 0)
    telemetry = start(rec, metrics_addr=metrics_address(port_offset), otlp_endpoint=endpoint,
                      logs=None, log_capacity=request_tokens is not None,
                      request_tokens=request_tokens or 8192, logger=logger,
                      summary_interval_s=interval, port_attempts=PORT_ATTEMPTS)
    logger.info("kvobs_enabled", engine=rec.engine, model=rec.model,
                metrics_url=telemetry.metrics_url, otlp_endpoint=endpoint, **rec.labels)
    return telemetry
