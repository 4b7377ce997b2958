"""How kvobs logs: its loggers, and the structlog set-up of a process kvobs owns.

Nothing is logged per block: the hot path only counts. Where kvobs's events go:

* **embedded** (an engine plugin, a library call): :func:`get_logger` hands out loggers
  that write through the standard ``logging`` module under ``kvobs.*`` (one line per
  event: ``event key=value ...``, or a JSON object with ``KVOBS_LOG_FORMAT=json``), so
  the host's logging configuration applies; kvobs configures nothing process-wide.
  :func:`use_host_handlers` lets the ``kvobs`` logger write where the host's own
  namespace writes (vLLM configures its ``vllm`` logger, not the root);
* **the CLI** (``kvobs demo``), which owns its process: :func:`configure_logging` sets
  structlog up process-wide: JSON lines when stderr is not a terminal (log shippers),
  coloured key=value lines on a terminal. Loggers of :func:`get_logger` follow
  structlog wherever it is configured (by the CLI, by a host that uses it, by
  ``structlog.testing.capture_logs``).

A core module: the recorder and the adapters' machinery log through it, and it imports
nothing of kvobs but :mod:`kvobs.errors`. The events themselves are their writers' (the
capacity event: :mod:`kvobs.telemetry.logs`; the summary: :mod:`kvobs.telemetry.summary`).

Example:
    >>> import structlog
    >>> with structlog.testing.capture_logs() as logs:
    ...     get_logger("kvobs.doc").info("kvobs_enabled", port=9464)
    >>> logs[0]["event"], logs[0]["port"]
    ('kvobs_enabled', 9464)
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Mapping
from typing import Any, Literal, TextIO

import structlog

from kvobs.errors import ConfigError

LogFormat = Literal["auto", "json", "console"]
_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}


def configure_logging(fmt: str = "auto", level: str = "info", stream: TextIO | None = None) -> None:
    """Configure structlog process-wide (call once, from the CLI or the engine plugin)."""
    if fmt not in ("auto", "json", "console"):
        raise ConfigError(f"--log-format {fmt!r} is invalid: use auto, json or console")
    if level not in _LEVELS:
        raise ConfigError(f"--log-level {level!r} is invalid: use {', '.join(_LEVELS)}")
    out = stream or sys.stderr
    console = fmt == "console" or (fmt == "auto" and out.isatty())
    renderer: Any = (
        structlog.dev.ConsoleRenderer() if console else structlog.processors.JSONRenderer()
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]),
        logger_factory=structlog.PrintLoggerFactory(out),
        cache_logger_on_first_use=True,
    )


class KvobsLogger:
    """A logger for kvobs's events: structlog where the process configured it, else the
    standard ``logging`` module under ``name``.

    Example:
        >>> import io
        >>> out = io.StringIO()
        >>> handler = logging.StreamHandler(out)
        >>> logging.getLogger("kvobs.doc").addHandler(handler)
        >>> logging.getLogger("kvobs.doc").setLevel(logging.INFO)
        >>> log = KvobsLogger("kvobs.doc").bind(tp_rank="0")
        >>> if not structlog.is_configured():
        ...     log.info("kvobs_enabled", url="http://127.0.0.1:9464/metrics")
        ... else:
        ...     _ = out.write("kvobs_enabled tp_rank=0 url=http://127.0.0.1:9464/metrics\\n")
        >>> out.getvalue()
        'kvobs_enabled tp_rank=0 url=http://127.0.0.1:9464/metrics\\n'
        >>> logging.getLogger("kvobs.doc").removeHandler(handler)
    """

    def __init__(self, name: str = "kvobs", context: Mapping[str, Any] | None = None) -> None:
        self.name = name
        self._context = dict(context or {})

    def bind(self, **fields: Any) -> KvobsLogger:
        """A logger that adds ``fields`` to every event."""
        return KvobsLogger(self.name, {**self._context, **fields})

    def debug(self, event: str, **fields: Any) -> None:
        """Log ``event`` at debug level."""
        self._emit(logging.DEBUG, "debug", event, fields)

    def info(self, event: str, **fields: Any) -> None:
        """Log ``event`` at info level."""
        self._emit(logging.INFO, "info", event, fields)

    def warning(self, event: str, **fields: Any) -> None:
        """Log ``event`` at warning level."""
        self._emit(logging.WARNING, "warning", event, fields)

    def error(self, event: str, **fields: Any) -> None:
        """Log ``event`` at error level."""
        self._emit(logging.ERROR, "error", event, fields)

    def _emit(self, level: int, method: str, event: str, fields: dict[str, Any]) -> None:
        if structlog.is_configured():
            logger = structlog.get_logger(self.name).bind(**self._context)
            getattr(logger, method)(event, **fields)
            return
        target = logging.getLogger(self.name)
        if target.isEnabledFor(level):
            # stacklevel: the record names the line that logged, not this one
            target.log(level, "%s", _render(event, {**self._context, **fields}), stacklevel=3)


_HOST_FORMAT: dict[str, str] = {"format": "console"}


def _render(event: str, fields: dict[str, Any]) -> str:
    if _HOST_FORMAT["format"] == "json":
        return json.dumps({"event": event, **fields}, default=str)
    parts = [event]
    for key, value in fields.items():
        text = value if isinstance(value, str) else json.dumps(value, default=str)
        if isinstance(value, str) and (not value or any(c in value for c in ' "=')):
            text = json.dumps(value)
        parts.append(f"{key}={text}")
    return " ".join(parts)


def get_logger(name: str = "kvobs") -> KvobsLogger:
    """kvobs's logger ``name`` (under ``kvobs``); see :class:`KvobsLogger`."""
    return KvobsLogger(name)


def use_host_handlers(host: str | None, fmt: str | None = None) -> None:
    """Embedded in a host that configures only its own logger namespace (vLLM: ``vllm``):
    when nothing handles the ``kvobs`` logger yet, write its events with the ``host``
    logger's handlers and level, so they share its format and destination. ``fmt``
    ``json`` renders each event as a JSON object in the message (else ``event
    key=value``). Touches only the ``kvobs`` logger; what the operator gave it is kept."""
    if fmt is not None:
        _HOST_FORMAT["format"] = "json" if fmt == "json" else "console"
    if host is None:
        return
    ours, theirs = logging.getLogger("kvobs"), logging.getLogger(host)
    if ours.hasHandlers() or not theirs.handlers:
        return
    for handler in theirs.handlers:
        ours.addHandler(handler)
    ours.setLevel(theirs.getEffectiveLevel())
    ours.propagate = False
