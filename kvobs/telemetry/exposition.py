"""Render a recorder for Prometheus: one scrape, one snapshot, straight to text.

:class:`SnapshotCollector` is a prometheus_client custom collector: each scrape takes one
recorder snapshot (plus the shared histograms and any extra source, NVML) and yields the
catalog's families with the final names of :mod:`kvobs.catalog`. No OpenTelemetry SDK sits
on this path, so ``/metrics`` works with every prometheus_client kvobs declares and costs
the engine one snapshot per scrape. Every series carries the common labels (engine, model,
the recorder's constant labels); ``target_info`` carries kvobs's version.

Example:
    >>> from prometheus_client import CollectorRegistry, generate_latest
    >>> from kvobs.recorder import Recorder
    >>> rec = Recorder(engine="demo", model="m")
    >>> _ = rec.add_tier("gpu", capacity_blocks=4, block_tokens=16, block_bytes=1024)
    >>> registry = CollectorRegistry()
    >>> registry.register(SnapshotCollector(rec))
    >>> text = generate_latest(registry).decode()
    >>> 'kvobs_tier_capacity_blocks{engine="demo",model="m",tier="gpu"} 4.0' in text
    True
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from kvobs._version import __version__
from kvobs.catalog import METRICS, MetricSpec
from kvobs.telemetry.series import SeriesSource, recorder_series

if TYPE_CHECKING:  # the recorder (and what it imports) loads with the engine
    from kvobs.recorder import Recorder


class SnapshotCollector(Collector):
    """Every catalog metric of ``recorder`` (and ``sources``) at scrape time.

    Args:
        recorder: the hot-path recorder to read.
        sources: extra series providers (NVML) for catalog metrics the recorder lacks;
            one that raises is counted (``telemetry.source``) and left out of the scrape.
    """

    def __init__(self, recorder: Recorder, sources: Sequence[SeriesSource] = ()) -> None:
        self._recorder = recorder
        self._sources = tuple(sources)
        self._common = {"engine": recorder.engine, "model": recorder.model, **recorder.labels}

    def describe(self) -> list[Metric]:
        """The families this collector yields (so registering it collects nothing)."""
        return [_family(spec) for spec in METRICS]

    def collect(self) -> Iterator[Metric]:
        """One snapshot, rendered whole or not at all: a failure is counted
        (``telemetry.prometheus``) and raised to the server, which answers 500 with one
        line (a scrape that half-succeeded would read as series vanishing)."""
        try:
            families = self._families()
        except Exception as exc:
            self._recorder.error("telemetry.prometheus", exc)
            raise
        yield from families

    def _families(self) -> list[Metric]:
        rec, common = self._recorder, self._common
        histograms = rec.histograms.collect()
        series = recorder_series(rec, self._sources)
        info = Metric("target", "kvobs's version and the labels of this process.", "info")
        info.add_sample("target_info", {"service_name": "kvobs",
                                        "service_version": __version__, **common}, 1)
        families = [info]
        for spec in METRICS:
            family = _family(spec)
            if spec.kind == "histogram":
                for name, labels, histogram in histograms:
                    if name != spec.name:
                        continue
                    full = {**common, **labels}
                    for bound, count in histogram.cumulative():
                        family.add_sample(f"{name}_bucket",
                                          {**full, "le": _le(bound)}, count)
                    family.add_sample(f"{name}_count", full, histogram.count)
                    family.add_sample(f"{name}_sum", full, histogram.sum)
            else:
                for labels, value in series.get(spec.name, ()):
                    family.add_sample(spec.name, {**common, **labels}, value)
            if family.samples:
                families.append(family)
        return families


def _family(spec: MetricSpec) -> Metric:
    name = spec.name.removesuffix("_total") if spec.kind == "counter" else spec.name
    return Metric(name, spec.help, spec.kind)


def _le(bound: float) -> str:
    """A bucket bound as Prometheus clients write it (``+Inf``, ``0.005``, ``10.0``)."""
    return "+Inf" if math.isinf(bound) else repr(float(bound))
