"""Testing helpers for adapter authors: a conformance kit and an in-memory telemetry capture.

:class:`Conformance` checks, after every step of an engine you drive, that what the
adapter reported is internally consistent and agrees with the engine's own account:

* bounds: ``0 <= in_use``, ``0 <= cached``, ``in_use + cached <= capacity`` per tier;
* flows explain the gauges: ``in_use == allocations + reuses - frees`` and
  ``cached == frees_to_cache + stores - reuses - evictions`` (so a duplicate put or get
  that is counted twice, or a free that is never counted, shows up at once);
* truth: occupancy equals ``truth()``, the engine's own ``{tier: (in_use, cached)}``;
* counters never go backwards between checks;
* lookups: hits never exceed looked-up tokens (the outcomes sum to them);
* stores equal the offload transfers (to a slower tier) that landed in the tier, where
  this process counts transfers into it.

:func:`capture_telemetry` runs the real OpenTelemetry pipeline into memory and captures
structlog events, in the spirit of ``structlog.testing.capture_logs``.

Example (the reference pool; an engine adapter's test looks the same)::

    >>> from kvobs.pool import TieredKVPool
    >>> from kvobs.presets import preset_layout
    >>> from kvobs.recorder import Recorder
    >>> rec = Recorder()
    >>> pool = TieredKVPool(preset_layout("qwen2.5-0.5b"), gpu_blocks=8, host_blocks=16,
    ...                     recorder=rec, device="cpu")
    >>> kit = Conformance(rec, truth=pool.occupancy)
    >>> for turn in range(6):
    ...     alloc = pool.admit([("chat", turn % 2, 96)], output_tokens=16)
    ...     pool.release(alloc, [("chat", turn % 2, 96)])
    ...     _ = kit.check(f"turn {turn}")
    >>> with capture_telemetry(rec) as telemetry:
    ...     telemetry.value("kvobs_block_stores_total", tier="host") > 0
    True
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, MutableMapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from kvobs.catalog import METRICS
from kvobs.recorder import Recorder
from kvobs.snapshot import RecorderSnapshot, TierSnapshot
from kvobs.tiers import tier_order

Truth = Callable[[], Mapping[str, tuple[int, int]]]

__all__ = ["Conformance", "ConformanceError", "TelemetryCapture", "capture_telemetry"]


class ConformanceError(AssertionError):
    """An adapter broke the contract; the message lists every problem of the step."""


def _tier_counters(t: TierSnapshot) -> dict[str, int]:
    counters = {"allocations": t.allocations, "frees": t.frees,
                "frees_to_cache": t.frees_to_cache, "reuses": t.reuses, "stores": t.stores}
    counters.update({f"evictions[{reason}]": n for reason, n in t.evictions.items()})
    return counters


def _counters(snap: RecorderSnapshot) -> dict[str, float]:
    values: dict[str, float] = {}
    for t in snap.tiers:
        values.update({f"{t.tier}.{name}": n for name, n in _tier_counters(t).items()})
    for link in snap.links:
        prefix = f"{link.src}->{link.dst}"
        for name in ("operations", "blocks", "bytes", "failures", "drops", "seconds"):
            values[f"{prefix}.{name}"] = getattr(link, name)
    lookups = snap.lookups
    values.update({"lookups": lookups.lookups, "lookup_tokens": lookups.tokens,
                   "gpu_hit": lookups.gpu_hit, "host_hit": lookups.host_hit,
                   "disk_hit": lookups.disk_hit})
    thrash = snap.thrash
    values.update({"thrash.onloads": thrash.onloads_in_window,
                   "thrash.reused": thrash.offloaded_reused,
                   "thrash.evicted_unused": thrash.offloaded_evicted_unused})
    values.update({f"errors[{c}]": n for c, n in snap.errors.items()})
    return values


@dataclass
class Conformance:
    """Checks one recorder after every step of an engine driven by a test.

    Args:
        rec: the recorder the adapter counts into.
        truth: the engine's own occupancy, ``{tier: (in_use, cached)}`` in the tier's
            blocks; tiers it leaves out are checked for bounds and flows only.
        flows: check that the counter flows explain the occupancy (turn off only for an
            adapter documented to read occupancy without counting every flow).
        stores_match_transfers: check that each tier's stores equal the blocks of the
            counted transfers into it (turn off where stores land in another process).
        allow_errors: instrumentation errors tolerated (a fault-injection test sets it).
    """

    rec: Recorder
    truth: Truth | None = None
    flows: bool = True
    stores_match_transfers: bool = True
    allow_errors: bool = False
    steps: int = 0
    _last: dict[str, float] = field(default_factory=dict)

    def check(self, step: str = "") -> RecorderSnapshot:
        """Check the recorder now; raise :class:`ConformanceError` naming every problem."""
        snap = self.rec.snapshot()
        problems = [*self._tier_problems(snap), *self._counter_problems(snap)]
        lookups = snap.lookups
        if lookups.gpu_hit + lookups.host_hit + lookups.disk_hit > lookups.tokens:
            problems.append(f"lookup hits {lookups.outcomes()} exceed tokens {lookups.tokens}")
        if snap.errors and not self.allow_errors:
            problems.append(f"instrumentation errors {dict(snap.errors)}")
        self.steps += 1
        if problems:
            where = f" at {step}" if step else f" at check {self.steps}"
            raise ConformanceError(f"adapter contract broken{where}:\n  " + "\n  ".join(problems))
        return snap

    def _tier_problems(self, snap: RecorderSnapshot) -> list[str]:
        problems = []
        truth = dict(self.truth()) if self.truth is not None else {}
        landed: dict[str, int] = {}
        counted_into: set[str] = set()
        for link in snap.links:
            if link.counts and tier_order(link.dst) > tier_order(link.src):  # offloads
                landed[link.dst] = landed.get(link.dst, 0) + link.blocks
                counted_into.add(link.dst)
        for t in snap.tiers:
            name, in_use, cached = t.tier, t.in_use_blocks, t.cached_blocks
            if in_use < 0 or cached < 0 or in_use + cached > t.capacity_blocks:
                problems.append(f"{name}: in_use {in_use} + cached {cached} outside "
                                f"[0, capacity {t.capacity_blocks}]")
            if self.flows:
                flow_in_use = t.allocations + t.reuses - t.frees
                flow_cached = t.frees_to_cache + t.stores - t.reuses - t.evictions_total
                if (flow_in_use, flow_cached) != (in_use, cached):
                    problems.append(
                        f"{name}: flows give in_use {flow_in_use}, cached {flow_cached} "
                        f"(allocations {t.allocations} + reuses {t.reuses} - frees {t.frees}; "
                        f"frees_to_cache {t.frees_to_cache} + stores {t.stores} - reuses - "
                        f"evictions {t.evictions_total}) but occupancy reads in_use {in_use}, "
                        f"cached {cached}")
            if name in truth and tuple(truth[name]) != (in_use, cached):
                problems.append(f"{name}: kvobs reads (in_use, cached) = {(in_use, cached)}, "
                                f"the engine {tuple(truth[name])}")
            if self.stores_match_transfers and name in counted_into and \
                    t.stores != landed[name]:
                problems.append(f"{name}: {t.stores} stores but {landed[name]} blocks "
                                "transferred into it")
        return problems

    def _counter_problems(self, snap: RecorderSnapshot) -> list[str]:
        now = _counters(snap)
        problems = [f"counter {name} went backwards: {self._last[name]} -> {value}"
                    for name, value in now.items()
                    if name in self._last and value < self._last[name]]
        self._last = now
        return problems


class TelemetryCapture:
    """What :func:`capture_telemetry` collected: metric values and structlog events."""

    def __init__(self, reader: Any, logs: list[MutableMapping[str, Any]]) -> None:
        self._reader = reader
        self.logs = logs
        self._names = {spec.otel_name: spec.name for spec in METRICS}

    def collect(self) -> dict[str, list[tuple[dict[str, str], float]]]:
        """Collect now: ``{catalog metric name: [(labels, value)]}`` (a histogram's value
        is its sample count)."""
        found: dict[str, list[tuple[dict[str, str], float]]] = {}
        data = self._reader.get_metrics_data()
        for resource in data.resource_metrics if data else ():
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    name = self._names.get(metric.name, metric.name)
                    for point in metric.data.data_points:
                        value = getattr(point, "value", None)
                        if value is None:
                            value = point.count
                        found.setdefault(name, []).append((dict(point.attributes), value))
        return found

    def value(self, name: str, **labels: str) -> float:
        """Sum of the series of ``name`` whose labels include ``labels`` (0 if none)."""
        return sum(v for attrs, v in self.collect().get(name, ())
                   if all(attrs.get(k) == want for k, want in labels.items()))


@contextmanager
def capture_telemetry(rec: Recorder) -> Iterator[TelemetryCapture]:
    """Export ``rec`` through the real OpenTelemetry bridge into memory, and capture logs.

    Example:
        >>> rec = Recorder()
        >>> rec.lookup(64, gpu_hit=16)
        >>> with capture_telemetry(rec) as telemetry:
        ...     telemetry.value("kvobs_lookup_tokens_total", outcome="miss")
        48
    """
    import structlog.testing
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from kvobs.telemetry.otel import OtelBridge

    reader = InMemoryMetricReader()
    bridge = OtelBridge(rec, [reader])
    try:
        with structlog.testing.capture_logs() as logs:
            yield TelemetryCapture(reader, logs)
    finally:
        bridge.shutdown()
