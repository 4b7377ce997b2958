"""What would a cache of another size hit? Hit-ratio curves from a trace or a fleet.

Two sources, one answer (the predicted LRU hit ratio of block references per size):

* :func:`curve_from_trace` replays a JSONL trace (:mod:`kvobs.trace`) through a
  :class:`~kvobs.reuse.ReuseProfile`: exactly (every block tracked) up to
  ``exact_limit`` references, sampled beyond;
* :func:`curves_from_prometheus` reads the ``kvobs_reuse_*`` counters of a running
  fleet over a window and applies the same SHARDS-adj correction: one curve per
  configured capacity, summed over the engines of that capacity only (their bucket
  bounds are the same multiples of the same size); sizes between two exported bounds
  are interpolated linearly.

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

from collections.abc import Sequence
from dataclasses import dataclass
from typing import IO, Any

from kvobs.errors import ConfigError
from kvobs.reuse import ReuseProfile, adjusted_hit_ratio, default_rate, interpolate
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
    capacity_blocks: float | None = None  # a fleet curve: its engines' configured capacity
    engines: int = 1  # a fleet curve: how many engines it sums
    #: a fleet curve: the lowest share of blocks its engines' profiles tracked in the
    #: window (1: every block, exact at the bucket bounds; None: not exported)
    tracking_rate: float | None = None
    #: a fleet curve: the fewest blocks up to which its engines' profiles counted every
    #: distance exactly in the window (their exact stacks; None: not exported)
    exact_blocks: float | None = None

    def hit_ratio(self, size_blocks: float) -> float:
        """Predicted hit ratio of block references for a cache of ``size_blocks``."""
        if self._profile is not None:
            return self._profile.hit_ratio(size_blocks)
        return interpolate(self._points, size_blocks)


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
    # beyond the limit, still exact if the profile never had to sample (every block fit)
    exact = exact or (profile.tracking_rate == 1.0 and profile.forgotten == 0)
    return Curve(float(total), exact, source, _profile=profile)


#: Read when present: whether the engines' profiles tracked every block (exact at bounds).
TRACKING_SERIES = "kvobs_reuse_tracking_rate"
#: Read when present: up to how many blocks the engines' profiles were exact.
EXACT_SERIES = "kvobs_reuse_exact_blocks"

#: The series a fleet's curve is read from (all four are needed).
PROFILE_SERIES = (
    "kvobs_reuse_sampled_references_total",
    "kvobs_reuse_references_total",
    "kvobs_reuse_sample_rate",
    "kvobs_reuse_capacity_blocks",
)


def curves_from_prometheus(client: object, window: str = "1h",
                           selector: str = "") -> list[Curve]:
    """The fleet's curves over the last ``window`` (PromQL duration): one per configured
    capacity, each summed over the engines of that capacity, smallest capacity first.

    Sums stay within one capacity: an engine's bucket bounds are multiples of its own
    capacity, so ``le="4096"`` of one engine is not a bound of another. Within a capacity
    each engine's sampled counts are scaled by its own rate before they are added (the
    SHARDS-adj sum in references), so engines sampled at different rates add up too.
    ``client`` is a :class:`kvobs.report.prometheus_api.PrometheusClient`; ``selector``
    narrows the series (``engine="vllm",model="llama"``).

    Raises:
        ConfigError: Prometheus has none of the profile's series for the selector and
            window, or lacks one of them (the message names it).
    """
    query = client.query  # type: ignore[attr-defined]
    where = f"{{{selector}}}" if selector else ""
    sampled, references, rate, capacity = (
        query(f"increase({PROFILE_SERIES[0]}{where}[{window}])"),
        query(f"increase({PROFILE_SERIES[1]}{where}[{window}])"),
        query(f"last_over_time({PROFILE_SERIES[2]}{where}[{window}])"),
        query(f"last_over_time({PROFILE_SERIES[3]}{where}[{window}])"),
    )
    scope = f" for {selector}" if selector else ""
    found = [bool(result) for result in (sampled, references, rate, capacity)]
    if not any(found):
        raise ConfigError(f"no kvobs_reuse_* data in the last {window}{scope}: is a kvobs "
                          "engine with prefix lookups scraped by this Prometheus?")
    if not all(found):
        missing = ", ".join(n for n, ok in zip(PROFILE_SERIES, found, strict=True) if not ok)
        raise ConfigError(f"Prometheus has no {missing} in the last {window}{scope} (the "
                          "other kvobs_reuse_* series are there): scrape a kvobs version that "
                          "exports every reuse series, or widen --window")
    engines: dict[tuple[tuple[str, str], ...], dict[str, Any]] = {}
    for kind, result in (("references", references), ("rate", rate),
                         ("capacity", capacity)):
        for series in result:
            if series.samples:
                engines.setdefault(_identity(series.labels), {"sampled": {}})[kind] = \
                    series.samples[-1][1]
    for series in sampled:
        engine = engines.get(_identity(series.labels))
        le = series.labels.get("le")
        if engine is not None and le is not None and series.samples:
            engine["sampled"][le] = series.samples[-1][1]
    groups: dict[float, list[dict[str, Any]]] = {}
    for engine in engines.values():
        if {"references", "rate", "capacity"} <= engine.keys() and "+Inf" in engine["sampled"] \
                and engine["rate"] > 0:
            groups.setdefault(engine["capacity"], []).append(engine)
    if not groups:
        raise ConfigError(f"no engine has every kvobs_reuse_* series in the last {window}"
                          f"{scope}: is its /metrics scraped whole?")
    # optional (older kvobs versions do not export them): the lowest tracked share, and
    # the fewest blocks up to which distances were exact
    for name, field in ((TRACKING_SERIES, "tracking"), (EXACT_SERIES, "exact")):
        for series in query(f"min_over_time({name}{where}[{window}])"):
            engine = engines.get(_identity(series.labels))
            if engine is not None and series.samples:
                engine[field] = series.samples[-1][1]
    source = getattr(client, "base_url", "prometheus")
    return [_group_curve(members, capacity_blocks, source)
            for capacity_blocks, members in sorted(groups.items())]


def curve_from_prometheus(client: object, window: str = "1h", selector: str = "") -> Curve:
    """The fleet's curve where every selected engine has one capacity (see
    :func:`curves_from_prometheus`).

    Raises:
        ConfigError: no data, a missing series, or engines of several capacities (the
            message lists them).
    """
    curves = curves_from_prometheus(client, window, selector)
    if len(curves) > 1:
        sizes = ", ".join(f"{c.capacity_blocks:,.0f}" for c in curves)
        raise ConfigError(f"the selected engines have {len(curves)} capacities ({sizes} "
                          "blocks): their curves do not add up; narrow --selector")
    return curves[0]


def _identity(labels: dict[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in labels.items() if k not in ("le", "__name__")))


def _group_curve(members: list[dict[str, Any]], capacity_blocks: float, source: str) -> Curve:
    """SHARDS-adj over engines of one capacity, in references (each engine's sampled
    counts divided by its rate)."""
    references = sum(m["references"] for m in members)
    every = sum(m["sampled"]["+Inf"] / m["rate"] for m in members)
    bounds = sorted({le for m in members for le in m["sampled"] if le != "+Inf"}, key=float)
    points = []
    for le in bounds:
        hits = sum(m["sampled"].get(le, 0.0) / m["rate"] for m in members)
        points.append((float(le), adjusted_hit_ratio(hits, every, references, 1.0)
                       if references > 0 else 0.0))
    def lowest(field: str) -> float | None:
        return min(float(m[field]) for m in members) if all(field in m for m in members) \
            else None

    return Curve(references, False, source, _points=tuple(points),
                 capacity_blocks=capacity_blocks, engines=len(members),
                 tracking_rate=lowest("tracking"), exact_blocks=lowest("exact"))


def host_hit_ratio(curve: Curve, gpu_blocks: float, host_blocks: float,
                   inclusive: bool = True) -> float:
    """Predicted fraction of references that hit the host tier (not the GPU)."""
    effective = max(gpu_blocks, host_blocks) if inclusive else gpu_blocks + host_blocks
    return max(curve.hit_ratio(effective) - curve.hit_ratio(gpu_blocks), 0.0)


def table(curve: Curve, sizes: Sequence[float]) -> list[dict[str, float]]:
    """``[{"blocks": size, "hit_ratio": ratio}]`` for each size."""
    return [{"blocks": size, "hit_ratio": curve.hit_ratio(size)} for size in sizes]
