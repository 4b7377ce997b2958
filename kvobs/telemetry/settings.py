"""One settings object for telemetry, read once: explicit values, ``KVOBS_*``, ``OTEL_*``.

Precedence follows OpenTelemetry's: an explicit value (a flag, a keyword argument), then
the environment variable, then the default. Every variable is parsed by one function,
:func:`read_env`, under one of two policies:

* **strict** (the CLI, :func:`kvobs.start_telemetry`): a value that does not parse is a
  :class:`~kvobs.errors.ConfigError` naming the variable, the value and the fix;
* **embedded** (the engine plugins, ``on_invalid`` given): the value is ignored, the
  default is used, and ``on_invalid`` is told (the plugin logs one warning line in the
  engine's log naming the variable, what was ignored and what is used). A typo in a pod
  spec never disables kvobs, nor goes unsaid.

=============================  ===================================  =======================
setting                        variable                             default
=============================  ===================================  =======================
``metrics_addr``               ``KVOBS_METRICS_ADDR``               ``127.0.0.1:9464``
                               (empty: no ``/metrics``)
``metrics_min_interval_s``     ``KVOBS_METRICS_MIN_INTERVAL_S``     0.25 (0: every scrape
                                                                    collects)
``web_config_file``            ``KVOBS_WEB_CONFIG_FILE``            none (plain HTTP)
``otlp_endpoint``              ``KVOBS_OTLP_ENDPOINT``, then        none (no push)
                               ``OTEL_EXPORTER_OTLP_ENDPOINT``
``otlp_interval_s``            ``OTEL_METRIC_EXPORT_INTERVAL``      10
                               (milliseconds)
``summary_interval_s``         ``KVOBS_SUMMARY_INTERVAL_S``         60 (0: off)
``log_format``                 ``KVOBS_LOG_FORMAT``                 none (the host's)
``trace_out``                  ``KVOBS_TRACE_OUT``                  none
``trace_max_bytes``            ``KVOBS_TRACE_MAX_BYTES``            256 MiB
``prefill_seconds_per_token``  ``KVOBS_PREFILL_SECONDS_PER_TOKEN``  none (unknown until
                                                                    measured)
=============================  ===================================  =======================

Example:
    >>> env = {"KVOBS_METRICS_ADDR": "0.0.0.0:9500", "KVOBS_SUMMARY_INTERVAL_S": "6O"}
    >>> TelemetrySettings.from_env(env)
    Traceback (most recent call last):
    ...
    kvobs.errors.ConfigError: environment variable KVOBS_SUMMARY_INTERVAL_S='6O' is \
invalid: '6O' is not a number: pass seconds, e.g. 60 (0: off)
    >>> ignored = []
    >>> settings = TelemetrySettings.from_env(env, on_invalid=lambda *a: ignored.append(a))
    >>> settings.metrics_addr, settings.summary_interval_s, ignored[0][0]
    ('0.0.0.0:9500', 60.0, 'KVOBS_SUMMARY_INTERVAL_S')
    >>> TelemetrySettings.from_env(env, summary_interval_s=0).summary_interval_s
    0
"""

from __future__ import annotations

import math
import os
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from kvobs.errors import ConfigError
from kvobs.telemetry.address import parse_address
from kvobs.telemetry.coalesce import MIN_INTERVAL_S

#: ``on_invalid(variable, raw value, reason, default used)``.
OnInvalid = Callable[[str, str, str, Any], None]
DEFAULT_ADDR = "127.0.0.1:9464"
LOG_FORMATS = ("auto", "json", "console")


class _FromEnv:
    """The default of an argument whose value comes from the environment, else the
    setting's default."""

    def __repr__(self) -> str:
        return "FROM_ENV"


#: Stands for "not given": the environment variable, else the default, applies.
FROM_ENV: Any = _FromEnv()


def read_env(variable: str, parse: Callable[[str], Any], default: Any,
             environ: Mapping[str, str] | None = None,
             on_invalid: OnInvalid | None = None) -> Any:
    """``parse`` of ``variable``'s value; ``default`` when it is unset or blank.

    Args:
        variable: the environment variable.
        parse: text -> value; raises ValueError (any subclass) saying what is wrong.
        default: the value when the variable is unset, blank, or (embedded) invalid.
        environ: the environment (default ``os.environ``).
        on_invalid: None raises; else told ``(variable, value, reason, default)`` and
            the default is returned.

    Raises:
        ConfigError: the value does not parse and ``on_invalid`` is None.
    """
    raw = (os.environ if environ is None else environ).get(variable)
    if raw is None or not raw.strip():
        return default
    try:
        return parse(raw.strip())
    except ValueError as exc:
        if on_invalid is None:
            raise ConfigError(f"environment variable {variable}={raw!r} is invalid: "
                              f"{exc}") from None
        on_invalid(variable, raw, str(exc), default)
        return default


def _number(text: str, fix: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a number: {fix}") from None
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{text!r} must be a finite number >= 0: {fix}")
    return value


def seconds(fix: str) -> Callable[[str], float]:
    """A parser of seconds >= 0 whose errors end with ``fix``."""
    return lambda text: _number(text, fix)


def milliseconds_as_seconds(text: str) -> float:
    """OpenTelemetry's intervals are milliseconds; kvobs's seconds (> 0)."""
    value = _number(text, "pass milliseconds, e.g. 10000")
    if value == 0:
        raise ValueError(f"{text!r} must be > 0: pass milliseconds, e.g. 10000")
    return value / 1000


def positive_int(text: str) -> int:
    """A whole number > 0 (bytes)."""
    if not text.isdigit() or int(text) == 0:
        raise ValueError(f"{text!r} is not a whole number > 0: pass bytes, e.g. 268435456")
    return int(text)


def address(text: str) -> str:
    """``HOST:PORT`` (the error names the fix)."""
    try:
        parse_address(text)
    except ConfigError:
        raise ValueError(f"{text!r} is not HOST:PORT: pass e.g. 127.0.0.1:9464 "
                         "(0.0.0.0:9464 inside a pod; empty: no /metrics)") from None
    return text


def http_url(text: str) -> str:
    """An ``http(s)://HOST[:PORT]`` URL."""
    parsed = urllib.parse.urlparse(text)
    try:
        parsed.port  # noqa: B018 - raises ValueError for a port out of range
    except ValueError:
        raise ValueError(f"{text!r} has an invalid port: use 1-65535") from None
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ValueError(f"{text!r} is not an http(s) URL: pass e.g. http://127.0.0.1:4318")
    return text


def log_format(text: str) -> str:
    """One of :data:`LOG_FORMATS`."""
    if text not in LOG_FORMATS:
        raise ValueError(f"{text!r} is not a log format: use {', '.join(LOG_FORMATS)}")
    return text


def _text(text: str) -> str:
    return text


@dataclass(frozen=True)
class TelemetrySettings:
    """What telemetry to start and how (see the module's table).

    Attributes:
        metrics_addr: ``HOST:PORT`` of ``/metrics``; None serves none.
        port_attempts: ports tried upwards from ``metrics_addr``'s when one is taken.
        metrics_min_interval_s: a collection serves the scrapes of this many seconds.
        web_config_file: exporter-toolkit web config for ``/metrics`` (TLS, basic auth).
        otlp_endpoint: OTLP/HTTP base URL to push to; None pushes nothing.
        otlp_interval_s: seconds between OTLP pushes.
        summary_interval_s: seconds between ``kv_cache_summary`` events; 0: none.
        log_format: how kvobs renders its own events; None leaves the host's as it is.
        trace_out: file the prefix lookups' block hashes are traced to (``kvobs whatif``).
        trace_max_bytes: the trace file stops growing at this size.
        prefill_seconds_per_token: a configured prefill cost per prompt token
            (:class:`~kvobs.benefit.PrefillCost`; the recorder's, where it has none yet).
        nvml: read GPU memory and PCIe facts from NVML where available.
    """

    metrics_addr: str | None = DEFAULT_ADDR
    port_attempts: int = 1
    metrics_min_interval_s: float = MIN_INTERVAL_S
    web_config_file: str | None = None
    otlp_endpoint: str | None = None
    otlp_interval_s: float = 10.0
    summary_interval_s: float = 60.0
    log_format: str | None = None
    trace_out: str | None = None
    trace_max_bytes: int = 256 << 20
    prefill_seconds_per_token: float | None = None
    nvml: bool = True

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, *,
                 on_invalid: OnInvalid | None = None, **explicit: Any) -> TelemetrySettings:
        """Explicit values (those not :data:`FROM_ENV`), else the variables, else defaults.

        Raises:
            ConfigError: a variable does not parse and ``on_invalid`` is None.
            TypeError: an explicit name that is not a setting.
        """
        env = os.environ if environ is None else environ
        given = {k: v for k, v in explicit.items() if v is not FROM_ENV}
        unknown = set(given) - {f.name for f in fields(cls)}
        if unknown:
            raise TypeError(f"unknown telemetry setting(s): {', '.join(sorted(unknown))}")
        base = cls()

        def read(name: str, variable: str, parse: Callable[[str], Any], default: Any) -> Any:
            if name in given:
                return given[name]
            return read_env(variable, parse, default, env, on_invalid)

        addr_raw = env.get("KVOBS_METRICS_ADDR")
        addr_default = None if addr_raw is not None and not addr_raw.strip() else base.metrics_addr
        otlp = read("otlp_endpoint", "KVOBS_OTLP_ENDPOINT", http_url, None)
        if otlp is None and "otlp_endpoint" not in given:  # then OpenTelemetry's variable
            otlp = read_env("OTEL_EXPORTER_OTLP_ENDPOINT", http_url, None, env, on_invalid)
        return replace(
            base,
            metrics_addr=read("metrics_addr", "KVOBS_METRICS_ADDR", address, addr_default),
            metrics_min_interval_s=read(
                "metrics_min_interval_s", "KVOBS_METRICS_MIN_INTERVAL_S",
                seconds("pass seconds, e.g. 0.25 (0: every scrape collects)"),
                base.metrics_min_interval_s),
            web_config_file=read("web_config_file", "KVOBS_WEB_CONFIG_FILE", _text, None),
            otlp_endpoint=otlp,
            otlp_interval_s=read("otlp_interval_s", "OTEL_METRIC_EXPORT_INTERVAL",
                                 milliseconds_as_seconds, base.otlp_interval_s),
            summary_interval_s=read("summary_interval_s", "KVOBS_SUMMARY_INTERVAL_S",
                                    seconds("pass seconds, e.g. 60 (0: off)"),
                                    base.summary_interval_s),
            log_format=read("log_format", "KVOBS_LOG_FORMAT", log_format, None),
            trace_out=read("trace_out", "KVOBS_TRACE_OUT", _text, None),
            trace_max_bytes=read("trace_max_bytes", "KVOBS_TRACE_MAX_BYTES", positive_int,
                                 base.trace_max_bytes),
            prefill_seconds_per_token=read(
                "prefill_seconds_per_token", "KVOBS_PREFILL_SECONDS_PER_TOKEN",
                seconds("pass seconds, e.g. 2.5e-5"), None),
            port_attempts=given.get("port_attempts", base.port_attempts),
            nvml=given.get("nvml", base.nvml),
        )
