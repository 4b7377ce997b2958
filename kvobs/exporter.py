"""Wire a recorder to every sink: ``/metrics``, OTLP push, NVML, the summary log.

:func:`start_telemetry` (``kvobs.start_telemetry``) is the front door: the logging
choice and the capacity event, then :meth:`Telemetry.start`, where every entry point
(the engine plugins, ``kvobs demo``) ends.

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

from typing import Any

from opentelemetry.sdk.metrics.export import MetricReader

from kvobs.capacity import CapacityPlan
from kvobs.logs import configure_logging, get_logger
from kvobs.recorder import Recorder
from kvobs.telemetry.logs import log_capacity as emit_capacity
from kvobs.telemetry.nvml import nvml_source
from kvobs.telemetry.otel import OtelBridge
from kvobs.telemetry.otlp import otlp_reader
from kvobs.telemetry.prometheus import MetricsServer, start_metrics_server
from kvobs.telemetry.requirements import check_declared
from kvobs.telemetry.settings import FROM_ENV, TelemetrySettings
from kvobs.telemetry.summary import SummaryLogger


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
        metrics_addr: str | None = FROM_ENV,
        otlp_endpoint: str | None = FROM_ENV,
        otlp_interval_s: float = FROM_ENV,
        summary_interval_s: float = FROM_ENV,
        extra_readers: tuple[MetricReader, ...] = (),
        port_attempts: int = FROM_ENV,
        nvml: bool = FROM_ENV,
        web_config_file: str | None = FROM_ENV,
        min_interval_s: float = FROM_ENV,
        settings: TelemetrySettings | None = None,
    ) -> Telemetry:
        """Start the sinks. An argument not given comes from its environment variable,
        else its default (:class:`~kvobs.telemetry.settings.TelemetrySettings`).

        Args:
            recorder: what to export.
            logger: logger for the summary and NVML events.
            metrics_addr: ``HOST:PORT`` for ``/metrics``; None serves nothing.
            otlp_endpoint: OTLP/HTTP base URL; None pushes nothing.
            otlp_interval_s: seconds between OTLP pushes.
            summary_interval_s: seconds between ``kv_cache_summary`` events; 0 disables.
            extra_readers: more OpenTelemetry readers (tests use an in-memory one).
            port_attempts: when the port of ``metrics_addr`` is taken, try the next ones
                (up to this many ports in all): several engine processes of one host
                can start from one base port. The port served is logged
                (``metrics_serving``) and is :attr:`metrics_url`.
            nvml: read GPU memory and PCIe facts from NVML where available.
            web_config_file: an exporter-toolkit web config file (TLS, client CA, basic
                auth) for ``/metrics`` (:mod:`kvobs.telemetry.webconfig`).
            min_interval_s: one collection serves every scrape of this many seconds
                (:mod:`kvobs.telemetry.coalesce`); 0 collects for every scrape.
            settings: every setting at once (read by a plugin); the arguments above are
                then ignored. Its ``prefill_seconds_per_token``
                (``KVOBS_PREFILL_SECONDS_PER_TOKEN``) becomes the recorder's configured
                prefill cost where it has none yet (:class:`~kvobs.benefit.PrefillCost`).

        Raises:
            ConfigError: an invalid value or variable (named), or a port that is taken.
        """
        check_declared()  # a package outside kvobs's declared range: one clear line
        if settings is None:
            settings = TelemetrySettings.from_env(
                metrics_addr=metrics_addr, otlp_endpoint=otlp_endpoint,
                otlp_interval_s=otlp_interval_s, summary_interval_s=summary_interval_s,
                port_attempts=port_attempts, nvml=nvml, web_config_file=web_config_file,
                metrics_min_interval_s=min_interval_s)
        configured = settings.prefill_seconds_per_token
        if configured is not None and recorder.prefill_cost.source == "none":
            recorder.prefill_cost.set(configured)  # a cost the recorder was given stays
        readers: list[MetricReader] = list(extra_readers)
        endpoint = settings.otlp_endpoint
        if endpoint:
            readers.append(otlp_reader(endpoint, recorder, interval_s=settings.otlp_interval_s))
        server = None
        if settings.metrics_addr:
            server = start_metrics_server(
                settings.metrics_addr, settings.web_config_file,
                port_attempts=settings.port_attempts,
                min_interval_s=settings.metrics_min_interval_s,
                on_error=lambda exc: recorder.error("telemetry.webconfig", exc))
        source = nvml_source(logger) if settings.nvml else None
        sources = (source,) if source else ()
        if server is not None:
            server.attach(recorder, sources)
        # OpenTelemetry only for what it pushes (OTLP, extra readers): /metrics needs none.
        bridge = OtelBridge(recorder, readers, sources=sources) if readers else None
        summary = None
        if settings.summary_interval_s > 0:
            summary = SummaryLogger(recorder, logger, settings.summary_interval_s).start()
        if server is not None:
            logger.info("metrics_serving", url=server.url, **recorder.labels)
        if endpoint:
            logger.info("otlp_pushing", endpoint=endpoint, interval_s=settings.otlp_interval_s)
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

def start_telemetry(
    recorder: Recorder,
    *,
    logs: str | None = None,
    log_capacity: bool = True,
    request_tokens: int = 8192,
    logger: Any = None,
    **options: Any,
) -> Telemetry:
    """Start exporting ``recorder``: ``/metrics``, OTLP, the capacity and summary logs.

    Every telemetry setting not passed comes from its ``KVOBS_*`` / ``OTEL_*`` variable,
    else its default (:mod:`kvobs.telemetry.settings`); a variable that does not parse is
    a ConfigError naming it.

    Args:
        recorder: the :class:`Recorder` the engine (or its adapter) counts into.
        logs: None (default) logs through the host's standard ``logging`` under the
            ``kvobs`` logger and configures nothing; ``"auto"`` (JSON off a terminal,
            console on one), ``"json"`` or ``"console"`` configures structlog
            process-wide to print kvobs's events (scripts that own their process).
        log_capacity: log the ``kv_cache_capacity`` event of the recorder's tiers now.
        request_tokens: request length the capacity log interprets capacity for.
        logger: logger for kvobs's events (default ``kvobs.logs.get_logger()``).
        **options: passed on to :meth:`Telemetry.start`: ``metrics_addr`` (``HOST:PORT``;
            port 0: any free port, ``telemetry.metrics_url`` says which; None serves
            nothing), ``otlp_endpoint``, ``otlp_interval_s``, ``summary_interval_s``,
            ``min_interval_s``, ``port_attempts``, ``nvml``, ``web_config_file``.

    Returns:
        The running :class:`Telemetry`; call ``close()`` at shutdown.

    Raises:
        ConfigError: an address, option or variable is invalid, the port is taken, or a
            telemetry package (OpenTelemetry, prometheus-client, structlog) is outside the
            range kvobs declares (the line names it, the version found and the fix).
    """
    if logs is not None:
        configure_logging(logs)
    logger = logger if logger is not None else get_logger("kvobs")
    if log_capacity and recorder.tier_names:
        emit_capacity(CapacityPlan.from_recorder(recorder, request_tokens=request_tokens), logger)
    return Telemetry.start(recorder, logger, **options)
