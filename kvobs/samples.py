"""Duration samples drained once and kept as cumulative histograms every reader shares.

The hot path appends transfer durations (per link) and residency / reuse-gap samples (per
tier) to bounded buffers. :class:`SampleHistograms` is the only thing that drains them:
each :meth:`~SampleHistograms.collect` folds the new samples into cumulative bucket counts
and hands the same batch to every subscriber (the OpenTelemetry bridge records it into its
SDK histograms). So a second reader, a ``/metrics`` scrape next to an OTLP push, never
takes samples away from another.

Example:
    >>> from kvobs.recorder import Recorder
    >>> rec = Recorder(engine="demo", model="m")
    >>> rec.link("gpu", "host").transfer(4, 4096, 0.002)
    >>> (name, labels, histogram), = rec.histograms.collect()
    >>> name, labels, histogram.count, histogram.cumulative()[-1]
    ('kvobs_transfer_duration_seconds', {'src_tier': 'gpu', 'dst_tier': 'host'}, 1, (inf, 1))
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from kvobs.catalog import DURATION_BUCKETS_S, RESIDENCY_BUCKETS_S

DURATION = "kvobs_transfer_duration_seconds"
#: A timing-only link's samples: shards of transfers another process counts.
SHARD_DURATION = "kvobs_transfer_shard_duration_seconds"
RESIDENCY = "kvobs_block_residency_seconds"
REUSE_GAP = "kvobs_block_reuse_gap_seconds"
#: Bucket upper bounds of each histogram metric.
BUCKETS: dict[str, tuple[float, ...]] = {
    DURATION: DURATION_BUCKETS_S,
    SHARD_DURATION: DURATION_BUCKETS_S,
    RESIDENCY: RESIDENCY_BUCKETS_S,
    REUSE_GAP: RESIDENCY_BUCKETS_S,
}
Labels = dict[str, str]
#: Told each drained batch: ``(metric name, labels, samples)``.
Subscriber = Callable[[str, Labels, Sequence[float]], None]


class DurationBuffer(Protocol):
    """A transfer direction's buffered durations (:class:`~kvobs.recorder.LinkRecorder`)."""

    @property
    def src(self) -> str: ...
    @property
    def dst(self) -> str: ...
    @property
    def counts(self) -> bool: ...
    def drain_durations(self) -> list[float]: ...


class ResidencyBuffer(Protocol):
    """A tier's buffered samples (:class:`~kvobs.residency.ResidencyTracker`):
    ``drain() -> (residency seconds, reuse gap seconds)``."""

    @property
    def drain(self) -> Callable[[], tuple[list[float], list[float]]]: ...


class TierBuffers(Protocol):
    """A tier whose residency may be sampled (:class:`~kvobs.recorder.TierRecorder`)."""

    @property
    def residency(self) -> ResidencyBuffer | None: ...


class SampleSource(Protocol):
    """What the histograms drain and count their subscribers' failures in: a
    :class:`~kvobs.recorder.Recorder` (named by its shape, so that this module, which the
    recorder imports, imports nothing of it)."""

    @property
    def links(self) -> Sequence[DurationBuffer]: ...
    @property
    def tier_names(self) -> Sequence[str]: ...
    def tier(self, name: str) -> TierBuffers: ...
    def error(self, component: str, exc: BaseException | None = None) -> None: ...


@dataclass(frozen=True)
class Histogram:
    """Cumulative counts of one series: ``counts[i]`` samples fell in bucket ``i``
    (``<= bounds[i]``, the last bucket above every bound)."""

    bounds: tuple[float, ...]
    counts: tuple[int, ...]
    sum: float

    @property
    def count(self) -> int:
        """Samples seen."""
        return sum(self.counts)

    def cumulative(self) -> list[tuple[float, int]]:
        """``(upper bound, samples <= it)`` pairs ending with ``(inf, count)``."""
        pairs, running = [], 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += n
            pairs.append((bound, running))
        return pairs


@dataclass
class _Series:
    bounds: tuple[float, ...]
    labels: Labels
    counts: list[int] = field(default_factory=list)
    sum: float = 0.0

    def add(self, samples: Iterable[float]) -> None:
        counts, bounds = self.counts, self.bounds
        for value in samples:
            counts[bisect_left(bounds, value)] += 1
            self.sum += value

    def frozen(self) -> Histogram:
        return Histogram(self.bounds, tuple(self.counts), self.sum)


class SampleHistograms:
    """The histograms of one recorder's sample buffers, drained at collection time."""

    def __init__(self, recorder: SampleSource) -> None:
        self._recorder = recorder
        self._series: dict[tuple[str, tuple[tuple[str, str], ...]], _Series] = {}
        self._subscribers: list[Subscriber] = []
        self._lock = threading.Lock()

    def subscribe(self, subscriber: Subscriber) -> None:
        """Also hand every drained batch to ``subscriber`` (under the collection lock)."""
        with self._lock:
            self._subscribers.append(subscriber)

    def unsubscribe(self, subscriber: Subscriber) -> None:
        """Stop handing batches to ``subscriber``."""
        with self._lock:
            if subscriber in self._subscribers:
                self._subscribers.remove(subscriber)

    def collect(self) -> list[tuple[str, Labels, Histogram]]:
        """Drain the buffers, tell the subscribers, return every series' histogram.

        A transfer direction's histogram exists from the link's creation (all zero until
        it is timed); a tier's residency and reuse-gap histograms from their first sample.
        """
        rec = self._recorder
        with self._lock:
            for link in rec.links:
                self._fold(DURATION if link.counts else SHARD_DURATION,
                           {"src_tier": link.src, "dst_tier": link.dst},
                           link.drain_durations(), keep_empty=True)
            for name in rec.tier_names:
                tracker = rec.tier(name).residency
                if tracker is None:
                    continue
                stays, gaps = tracker.drain()
                self._fold(RESIDENCY, {"tier": name}, stays, keep_empty=False)
                self._fold(REUSE_GAP, {"tier": name}, gaps, keep_empty=False)
            return [(metric, dict(s.labels), s.frozen())
                    for (metric, _key), s in self._series.items()]

    def _fold(self, metric: str, labels: Labels, samples: list[float], keep_empty: bool) -> None:
        key = (metric, tuple(labels.items()))
        series = self._series.get(key)
        if series is None:
            if not samples and not keep_empty:
                return
            bounds = BUCKETS[metric]
            series = self._series[key] = _Series(bounds, labels, [0] * (len(bounds) + 1))
        if samples:
            series.add(samples)
            for subscriber in self._subscribers:
                try:
                    subscriber(metric, labels, samples)
                except Exception as exc:  # a sink failure is counted, never raised
                    self._recorder.error("telemetry.samples", exc)
