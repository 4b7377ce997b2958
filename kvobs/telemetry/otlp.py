"""Push metrics as OTLP/HTTP protobuf to a collector.

The endpoint follows OpenTelemetry's convention for ``OTEL_EXPORTER_OTLP_ENDPOINT``: a
base URL to which ``/v1/metrics`` is appended. A failed export is counted in the
recorder's error counter (component ``telemetry.otlp``, exported as
``kvobs_instrumentation_errors_total``) and logged; the next interval tries again.

Under faults (tests/reliability/test_otlp_faults.py runs each against a real receiver):
the engine's thread never touches OTLP; exports run on the reader's one thread, one at a
time, each bounded by ``timeout_s`` including the exporter's retries (a refused
connection, a 429/5xx, a receiver that stalls or never answers all end within it), so
nothing queues and memory stays flat however long the collector is away. The next
interval collects fresh counters (cumulative), so recovery loses no count. The OTLP
exporter's own warnings are passed at most once a minute per message, like kvobs's.
"""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import urlparse

from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.sdk.metrics.export import (
    MetricExporter,
    MetricExportResult,
    MetricsData,
    PeriodicExportingMetricReader,
)

from kvobs.errors import ConfigError
from kvobs.ratelimit import RateLimit
from kvobs.recorder import Recorder

_EXPORTER_LOGGERS = (
    "opentelemetry.exporter.otlp.proto.http.metric_exporter",
    "opentelemetry.exporter.otlp.common.http",
)


class _OncePerInterval(logging.Filter):
    """Pass each message template at most once per ``interval_s`` (the exporter logs every
    failed attempt, which during an outage would be a warning every few seconds)."""

    def __init__(self, interval_s: float = 60.0) -> None:
        super().__init__()
        self._limit = RateLimit(interval_s)

    def filter(self, record: logging.LogRecord) -> bool:
        return self._limit.allow(str(record.msg))


def _quiet_exporter_logs() -> None:
    for name in _EXPORTER_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _OncePerInterval) for f in logger.filters):
            logger.addFilter(_OncePerInterval())


class _CountingExporter(MetricExporter):
    """Delegate to the OTLP exporter; count failures instead of letting them vanish."""

    def __init__(self, inner: OTLPMetricExporter, recorder: Recorder) -> None:
        super().__init__(
            preferred_temporality=inner._preferred_temporality,
            preferred_aggregation=inner._preferred_aggregation,
        )
        self._inner = inner
        self._recorder = recorder

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> MetricExportResult:
        try:
            result = self._inner.export(metrics_data, timeout_millis=timeout_millis, **kwargs)
        except Exception as exc:
            self._recorder.error("telemetry.otlp", exc)
            return MetricExportResult.FAILURE
        if result is not MetricExportResult.SUCCESS:
            self._recorder.error("telemetry.otlp", RuntimeError("OTLP export failed"))
        return result

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return self._inner.force_flush(timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self._inner.shutdown(timeout_millis=timeout_millis, **kwargs)


def metrics_url(endpoint: str) -> str:
    """``endpoint`` with ``/v1/metrics`` appended unless already there."""
    parsed = urlparse(endpoint)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise ConfigError(
            f"--otlp-endpoint {endpoint!r} is invalid: use http(s)://HOST:PORT, "
            "e.g. http://127.0.0.1:4318"
        )
    base = endpoint.rstrip("/")
    return base if base.endswith("/v1/metrics") else base + "/v1/metrics"


def otlp_reader(
    endpoint: str, recorder: Recorder, interval_s: float = 10.0, timeout_s: float = 5.0
) -> PeriodicExportingMetricReader:
    """A reader that pushes every ``interval_s`` to ``endpoint`` over OTLP/HTTP.

    ``timeout_s`` bounds one export, retries included; a failed one is counted.
    """
    if not interval_s > 0:
        raise ConfigError(f"OTLP export interval must be > 0 seconds, got {interval_s!r}")
    if not timeout_s > 0:
        raise ConfigError(f"OTLP export timeout must be > 0 seconds, got {timeout_s!r}")
    _quiet_exporter_logs()
    exporter = OTLPMetricExporter(endpoint=metrics_url(endpoint), timeout=timeout_s)
    return PeriodicExportingMetricReader(
        _CountingExporter(exporter, recorder),
        export_interval_millis=interval_s * 1000,
        export_timeout_millis=timeout_s * 1000,
    )
