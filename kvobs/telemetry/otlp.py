"""Push metrics as OTLP/HTTP protobuf to a collector.

The endpoint follows OpenTelemetry's convention for ``OTEL_EXPORTER_OTLP_ENDPOINT``: a
base URL to which ``/v1/metrics`` is appended. A failed export is counted in the
recorder's error counter (component ``telemetry.otlp``) and logged; the next interval
tries again.
"""

from __future__ import annotations

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
from kvobs.recorder import Recorder


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
    """A reader that pushes every ``interval_s`` to ``endpoint`` over OTLP/HTTP."""
    if not interval_s > 0:
        raise ConfigError(f"OTLP export interval must be > 0 seconds, got {interval_s!r}")
    exporter = OTLPMetricExporter(endpoint=metrics_url(endpoint), timeout=timeout_s)
    return PeriodicExportingMetricReader(
        _CountingExporter(exporter, recorder),
        export_interval_millis=interval_s * 1000,
        export_timeout_millis=timeout_s * 1000,
    )
