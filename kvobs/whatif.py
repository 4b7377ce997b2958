"""What would a cache of another size hit? Hit-ratio curves from a trace or a fleet.

Two sources, one answer (the predicted LRU hit ratio of block references per size):

* :func:`curve_from_trace` replays a JSONL trace (:mod:`kvobs.trace`) through a
  :class:`~kvobs.reuse.ReuseProfile`: exactly (every block tracked) up to
  ``exact_limit`` references, sampled beyond;
* :func:`curve_from_prometheus` reads the ``kvobs_reuse_*`` counters of a running
  fleet over a window, summed over every engine, and applies the same SHARDS-adj
  correction; sizes between two exported bounds are interpolated linearly.

Tier questions read the curve at the hierarchy's effective size: a GPU + host hierarchy
where the host keeps copies of GPU blocks (inclusive: vLLM CPU offloading, LMCache,
SGLang HiCache write-through) holds ``max(gpu, host)`` distinct blocks; one where a block
lives in one tier at a time (exclusive) holds ``gpu + host``. Host hits are then
``hit(effective) - hit(gpu)``.

Example:
    >>> import io
    >>> trace = io.StringIO('{"blocks": ["a", "b"]}\\n{"blocks": ["a", "b", "c"]}\\n')
    >>> curve = curve_from_trace(trace)
    >>> [round(curve.hit_ratio(n), 2) for n in (1, 2, 3)]
    [0.0, 0.4, 0.4]
    >>> round(host_hit_ratio(curve, gpu_blocks=1, host_blocks=2, inclusive=True), 2)
    0.4
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from typing import IO

from kvobs.errors import ConfigError
from kvobs.reuse import ReuseProfile, adjusted_hit_ratio, default_rate
from kvobs.trace import read_trace

#: Replays up to this many references exactly (rate 1); larger traces are sampled.
EXACT_LIMIT = 2_000_000


@dataclass(frozen=True)
class Curve:
    """Predicted LRU hit ratio as a function of cache size in blocks.

    Attributes:
        references: block references the curve describes.
        exact: computed from every reference (not sampled, not interpolated).
        source: where it came from (a trace path or a Prometheus URL).
    """

    references: float
    exact: bool
    source: str
    _profile: ReuseProfile | None = None
    _points: tuple[tuple[float, float], ...] = ()  # (bound blocks, hit ratio), sorted

    def hit_ratio(self, size_blocks: float) -> float:
        """Predicted hit ratio of block references for a cache of ``size_blocks``."""
        if self._profile is not None:
            return self._profile.hit_ratio(size_blocks)
        points = self._points
        if not points or size_blocks < points[0][0]:
            return 0.0 if not points else points[0][1] * size_blocks / points[0][0]
        i = bisect_right([b for b, _ in points], size_blocks) - 1
        if i >= len(points) - 1:
            return points[-1][1]
        (b0, h0), (b1, h1) = points[i], points[i + 1]
        return h0 + (h1 - h0) * (size_blocks - b0) / (b1 - b0)


def curve_from_trace(lines: IO[str], source: str = "trace",
                     exact_limit: int = EXACT_LIMIT) -> Curve:
    """Replay a trace; exact up to ``exact_limit`` references.

    Raises:
        ConfigError: a malformed line (its number named) or a trace with no references.
    """
    records = [(record.blocks, record.written) for record in read_trace(lines, source)]
    total = sum(len(blocks) for blocks, written in records if not written)
    if not total:
        raise ConfigError(f"{source}: the trace holds no block references: record one with "
                          "`kvobs demo --trace-out FILE`")
    distinct = len({key for blocks, _ in records for key in blocks})
    exact = total <= exact_limit
    rate = 1.0 if exact else default_rate(distinct)
    profile = ReuseProfile(max(distinct, 1), rate=rate, max_keys=max(distinct, 1) if exact
                           else 1 << 16, keep_samples=True)
    for blocks, written in records:
        (profile.write if written else profile.reference)(blocks)
    return Curve(float(total), exact, source, _profile=profile)


def curve_from_prometheus(client: object, window: str = "1h", selector: str = "") -> Curve:
    """The fleet's curve over the last ``window`` (PromQL duration), summed over engines.

    ``client`` is a :class:`kvobs.report.prometheus_api.PrometheusClient`; ``selector``
    narrows the series (``engine="vllm",model="llama"``).

    Raises:
        ConfigError: Prometheus has no reuse profile data for the selector and window.
    """
    query = client.query  # type: ignore[attr-defined]
    where = f"{{{selector}}}" if selector else ""
    sampled = query(f"sum by (le) (increase(kvobs_reuse_sampled_references_total{where}"
                    f"[{window}]))")
    expected = query(f"sum(increase(kvobs_reuse_references_total{where}[{window}]) "
                     f"* on(engine, model) group_left() max by (engine, model) "
                     f"(kvobs_reuse_sample_rate{where}))")
    totals = query(f"sum(increase(kvobs_reuse_references_total{where}[{window}]))")
    by_le = {s.labels.get("le", ""): s.samples[-1][1] for s in sampled if s.samples}
    if "+Inf" not in by_le or not expected or not totals or not expected[0].samples:
        scope = f" for {selector}" if selector else ""
        raise ConfigError(f"no kvobs_reuse_* data in the last {window}{scope}: is a kvobs "
                          "engine with prefix lookups scraped by this Prometheus?")
    all_sampled = by_le.pop("+Inf")
    expected_sampled = expected[0].samples[-1][1]
    references = totals[0].samples[-1][1]
    rate = expected_sampled / references if references else 1.0
    points = tuple(sorted(
        (float(le), adjusted_hit_ratio(hits, all_sampled, references, rate))
        for le, hits in by_le.items()))
    return Curve(references, False, getattr(client, "base_url", "prometheus"), _points=points)


def host_hit_ratio(curve: Curve, gpu_blocks: float, host_blocks: float,
                   inclusive: bool = True) -> float:
    """Predicted fraction of references that hit the host tier (not the GPU)."""
    effective = max(gpu_blocks, host_blocks) if inclusive else gpu_blocks + host_blocks
    return max(curve.hit_ratio(effective) - curve.hit_ratio(gpu_blocks), 0.0)


def table(curve: Curve, sizes: Sequence[float]) -> list[dict[str, float]]:
    """``[{"blocks": size, "hit_ratio": ratio}]`` for each size."""
    return [{"blocks": size, "hit_ratio": curve.hit_ratio(size)} for size in sizes]
