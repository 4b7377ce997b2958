"""Bridge recorder snapshots into an OpenTelemetry MeterProvider.

This is the push path (OTLP, or any OpenTelemetry reader); ``/metrics`` is rendered
without the SDK (:mod:`kvobs.telemetry.exposition`). Every catalog metric except the
histograms is an *observable* instrument whose callback reads a recorder snapshot at
collection time, so the engine's thread never calls OpenTelemetry. Duration samples
reach the bridge as the recorder's :class:`~kvobs.samples.SampleHistograms` drain them
(whoever collects first: a scrape or this bridge's first callback) and are recorded into
synchronous histograms, which the SDK aggregates in the same collection.

Example:
    >>> from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    >>> from kvobs.recorder import Recorder
    >>> rec = Recorder(engine="demo", model="m")
    >>> rec.link("gpu", "host").transfer(4, 4096, 0.002)
    >>> reader = InMemoryMetricReader()
    >>> bridge = OtelBridge(rec, [reader])
    >>> names = {m.name for rm in reader.get_metrics_data().resource_metrics
    ...          for sm in rm.scope_metrics for m in sm.metrics}
    >>> "kvobs_transfer_duration" in names and "kvobs_transfer_bytes" in names
    True
    >>> bridge.shutdown()
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import AlwaysOffExemplarFilter, MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader
from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View
from opentelemetry.sdk.resources import Resource

from kvobs._version import __version__
from kvobs.catalog import METRICS, MetricSpec, by_name
from kvobs.recorder import Recorder
from kvobs.samples import BUCKETS as _BUCKETS
from kvobs.telemetry.series import Series, SeriesSource, recorder_series


class OtelBridge:
    """Observable instruments over one recorder, exported through ``readers``.

    Args:
        recorder: the hot-path recorder to read.
        readers: OpenTelemetry metric readers (Prometheus, OTLP periodic, in-memory...).
        sources: extra series providers (NVML) for catalog metrics the recorder lacks.
    """

    def __init__(
        self,
        recorder: Recorder,
        readers: Sequence[MetricReader],
        sources: Sequence[SeriesSource] = (),
    ) -> None:
        self._recorder = recorder
        self._sources = tuple(sources)
        self._common = {"engine": recorder.engine, "model": recorder.model, **recorder.labels}
        self._series: Series = {}
        resource = Resource.create(
            {"service.name": "kvobs", "service.version": __version__, **self._common}
        )
        views = [
            View(instrument_name=by_name(name).otel_name,
                 aggregation=ExplicitBucketHistogramAggregation(list(buckets)))
            for name, buckets in _BUCKETS.items()
        ]
        # No exemplars: kvobs records no trace context, so they would only cost collection.
        self.provider = MeterProvider(metric_readers=list(readers), resource=resource,
                                      views=views, exemplar_filter=AlwaysOffExemplarFilter())
        meter = self.provider.get_meter("kvobs", __version__)
        self._histograms = {
            name: meter.create_histogram(spec.otel_name, unit=spec.unit, description=spec.help)
            for name, spec in ((n, by_name(n)) for n in _BUCKETS)
        }
        recorder.histograms.subscribe(self._record_samples)
        observable = [spec for spec in METRICS if spec.kind != "histogram"]
        for index, spec in enumerate(observable):
            create = (
                meter.create_observable_counter
                if spec.kind == "counter"
                else meter.create_observable_gauge
            )
            create(
                spec.otel_name,
                callbacks=[self._callback(spec, refresh=index == 0)],
                unit=spec.unit,
                description=spec.help,
            )

    def _callback(self, spec: MetricSpec, refresh: bool):  # type: ignore[no-untyped-def]
        # The SDK runs every callback of one collection in registration order, under one
        # lock shared by all readers: the first callback takes the snapshot the rest read.
        def observe(options: CallbackOptions) -> Iterable[Observation]:
            try:
                if refresh:
                    self._refresh()
                values = self._series.get(spec.name, ())
                return [Observation(v, {**self._common, **labels}) for labels, v in values]
            except Exception as exc:  # a sink failure is counted, never raised
                self._recorder.error("telemetry.otel", exc)
                return []

        return observe

    def _refresh(self) -> None:
        self._series = {}
        self._recorder.histograms.collect()  # hands new samples to _record_samples
        self._series = recorder_series(self._recorder, self._sources)

    def _record_samples(self, metric: str, labels: dict[str, str],
                        samples: Sequence[float]) -> None:
        histogram, attrs = self._histograms[metric], {**self._common, **labels}
        for seconds in samples:
            histogram.record(seconds, attrs)

    def force_flush(self) -> None:
        """Push pending data through every reader that pushes (OTLP)."""
        self.provider.force_flush()

    def shutdown(self) -> None:
        """Flush and stop every reader."""
        self._recorder.histograms.unsubscribe(self._record_samples)
        self.provider.shutdown()
