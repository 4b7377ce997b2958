"""Wire a recorder to every sink: ``/metrics``, OTLP push, NVML, the summary log.

Example:
    >>> import structlog
    >>> from kvobs.recorder import Recorder
    >>> with structlog.testing.capture_logs() as logs:
    ...     telemetry = Telemetry.start(Recorder(), structlog.get_logger("kvobs"),
    ...                                 metrics_addr="127.0.0.1:0", summary_interval_s=0)
    >>> telemetry.metrics_url.startswith("http://127.0.0.1:")
    True
    >>> telemetry.close()
"""

from __future__ import annotations

import os
from typing import Any

from opentelemetry.sdk.metrics.export import MetricReader

from kvobs.recorder import Recorder
from kvobs.telemetry.nvml import nvml_source
from kvobs.telemetry.otel import OtelBridge
from kvobs.telemetry.otlp import otlp_reader
from kvobs.telemetry.prometheus import MetricsServer, start_metrics_server
from kvobs.telemetry.requirements import check_declared
from kvobs.telemetry.summary import SummaryLogger
from kvobs.telemetry.webconfig import ENV_VAR as WEB_CONFIG_ENV
from kvobs.telemetry.webconfig import start_secure_metrics_server


class Telemetry:
    """The running sinks of one recorder. Close it to flush OTLP and free the port."""

    def __init__(
        self, bridge: OtelBridge | None, server: MetricsServer | None,
        summary: SummaryLogger | None,
    ) -> None:
        self.bridge = bridge
        self.server = server
        self.summary = summary

    @classmethod
    def start(
        cls,
        recorder: Recorder,
        logger: Any,
        *,
        metrics_addr: str | None = "127.0.0.1:9464",
        otlp_endpoint: str | None = None,
        otlp_interval_s: float = 10.0,
        summary_interval_s: float = 10.0,
        extra_readers: tuple[MetricReader, ...] = (),
        port_attempts: int = 1,
        nvml: bool = True,
        web_config_file: str | None = None,
    ) -> Telemetry:
        """Start the sinks.

        Args:
            recorder: what to export.
            logger: structlog logger for the summary and NVML events.
            metrics_addr: ``HOST:PORT`` for ``/metrics``; None serves nothing.
            otlp_endpoint: OTLP/HTTP base URL; None falls back to
                ``OTEL_EXPORTER_OTLP_ENDPOINT`` and, if unset too, pushes nothing.
            otlp_interval_s: seconds between OTLP pushes.
            summary_interval_s: seconds between ``kv_cache_summary`` events; 0 disables.
            extra_readers: more OpenTelemetry readers (tests use an in-memory one).
            port_attempts: when the port of ``metrics_addr`` is taken, try the next ones
                (up to this many ports in all): several engine processes of one host
                can start from one base port. The port served is logged
                (``metrics_serving``) and is :attr:`metrics_url`.
            nvml: read GPU memory and PCIe facts from NVML where available.
            web_config_file: an exporter-toolkit web config file (TLS, client CA, basic
                auth) for ``/metrics``; None falls back to ``KVOBS_WEB_CONFIG_FILE`` and,
                if unset too, serves plain HTTP (:mod:`kvobs.telemetry.webconfig`).
        """
        check_declared()  # a package outside kvobs's declared range: one clear line
        readers: list[MetricReader] = list(extra_readers)
        endpoint = otlp_endpoint or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or None
        if endpoint:
            readers.append(otlp_reader(endpoint, recorder, interval_s=otlp_interval_s))
        web_config = web_config_file or os.environ.get(WEB_CONFIG_ENV) or None
        if metrics_addr and web_config:
            server: MetricsServer | None = start_secure_metrics_server(
                metrics_addr, web_config, port_attempts,
                on_error=lambda exc: recorder.error("telemetry.webconfig", exc))
        else:
            server = start_metrics_server(metrics_addr, port_attempts) if metrics_addr else None
        source = nvml_source(logger) if nvml else None
        sources = (source,) if source else ()
        if server is not None:
            server.attach(recorder, sources)
        # OpenTelemetry only for what it pushes (OTLP, extra readers): /metrics needs none.
        bridge = OtelBridge(recorder, readers, sources=sources) if readers else None
        summary = None
        if summary_interval_s > 0:
            summary = SummaryLogger(recorder, logger, summary_interval_s).start()
        if server is not None:
            logger.info("metrics_serving", url=server.url, **recorder.labels)
        if endpoint:
            logger.info("otlp_pushing", endpoint=endpoint, interval_s=otlp_interval_s)
        return cls(bridge, server, summary)

    @property
    def metrics_url(self) -> str | None:
        """Scrape URL, or None when ``/metrics`` is not served."""
        return self.server.url if self.server else None

    def flush(self) -> None:
        """Push what OTLP (or an extra reader) has not been sent yet, now."""
        if self.bridge is not None:
            self.bridge.force_flush()

    def close(self) -> None:
        """Stop the summary thread, push a last OTLP export, stop serving."""
        if self.summary is not None:
            self.summary.stop()
        if self.bridge is not None:
            self.bridge.shutdown()
        if self.server is not None:
            self.server.close()
