"""What ``kvobs top`` shows, computed from two successive scrapes of one endpoint.

Gauges (capacity, occupancy) come from the latest scrape. Rates are counter deltas
divided by the time between the scrapes, like PromQL's ``rate()`` over the last
interval (a counter that went down was reset: its new value is the delta). Latency
quantiles are interpolated from the histogram buckets that grew in the interval, as
``histogram_quantile`` does; when no transfer finished in the interval they fall back
to all transfers since the start, and say so.

Example:
    >>> from kvobs.top.scrape import parse_text
    >>> text = ('kvobs_tier_capacity_blocks{tier="gpu"} 100\\n'
    ...         'kvobs_tier_resident_blocks{tier="gpu",state="in_use"} 60\\n'
    ...         'kvobs_tier_resident_blocks{tier="gpu",state="cached"} 30\\n')
    >>> view = build_view(parse_text(text, 0.0), None)
    >>> tier = view.tiers[0]
    >>> tier.name, tier.in_use, tier.cached, tier.free
    ('gpu', 60.0, 30.0, 10.0)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from kvobs.tiers import tier_order
from kvobs.top.scrape import Scrape

OUTCOMES = ("gpu_hit", "host_hit", "disk_hit", "miss")


@dataclass(frozen=True)
class TierView:
    """Capacity and occupancy of one tier, in blocks and bytes."""

    name: str
    capacity: float
    in_use: float
    cached: float
    capacity_bytes: float
    in_use_bytes: float
    cached_bytes: float

    @property
    def free(self) -> float:
        """Blocks holding no KV data."""
        return max(0.0, self.capacity - self.in_use - self.cached)


@dataclass(frozen=True)
class TransferView:
    """One direction: throughput, latency and losses over the last interval."""

    src: str
    dst: str
    bytes_per_s: float
    blocks_per_s: float
    p50_s: float | None
    p99_s: float | None
    latency_since_start: bool
    drops_per_s: float
    failures_per_s: float
    drops: float
    failures: float


@dataclass(frozen=True)
class EndpointView:
    """Everything one panel of ``kvobs top`` draws."""

    url: str
    title: str
    interval_s: float | None
    tiers: list[TierView] = field(default_factory=list)
    lookup_tokens: dict[str, float] = field(default_factory=dict)
    hits_since_start: bool = True
    lookups_per_s: float | None = None
    transfers: list[TransferView] = field(default_factory=list)
    thrash_per_s: float | None = None
    thrash: float = 0.0
    reused: float = 0.0
    evicted_unused: float = 0.0
    instrumentation_errors: float = 0.0

    @property
    def wasted_share(self) -> float | None:
        """Offloaded blocks evicted before any reuse, as a share of those settled."""
        settled = self.reused + self.evicted_unused
        return self.evicted_unused / settled if settled else None


def _delta(cur: float, prev: float | None) -> float:
    if prev is None:
        return 0.0
    return cur - prev if cur >= prev else cur  # a reset counter starts again from 0


def quantile(q: float, buckets: dict[float, float]) -> float | None:
    """``histogram_quantile(q, ...)`` of cumulative ``{le: count}`` buckets.

    Example:
        >>> quantile(0.5, {0.001: 10, 0.002: 20, math.inf: 20})
        0.001
        >>> quantile(0.99, {0.001: 0, 0.01: 0, math.inf: 5})
        0.01
    """
    if not buckets:
        return None
    bounds = sorted(buckets)
    total = buckets[bounds[-1]]
    if total <= 0:
        return None
    rank = q * total
    lower, below = 0.0, 0.0
    for le in bounds:
        count = buckets[le]
        if count >= rank:
            if math.isinf(le):
                return lower
            if count == below:
                return le
            return lower + (le - lower) * (rank - below) / (count - below)
        lower, below = le, count
    return lower


def _buckets(scrape: Scrape, src: str, dst: str) -> dict[float, float]:
    found = scrape.by("kvobs_transfer_duration_seconds_bucket", "le", src_tier=src, dst_tier=dst)
    return {float(le): count for (le,), count in found.items()}


def _title(scrape: Scrape) -> str:
    parts = [", ".join(scrape.labels("engine")), ", ".join(scrape.labels("model"))]
    return " · ".join(p for p in parts if p) or "kvobs"


def build_view(cur: Scrape, prev: Scrape | None) -> EndpointView:
    """The panel for the latest scrape ``cur``, with rates since ``prev`` (same endpoint)."""
    if prev is not None and (not prev.ok or prev.at_s >= cur.at_s):
        prev = None
    dt = cur.at_s - prev.at_s if prev is not None else None

    def rate(name: str, **match: str) -> float:
        if prev is None or not dt:
            return 0.0
        return _delta(cur.total(name, **match), prev.total(name, **match)) / dt

    tiers = []
    capacities = cur.by("kvobs_tier_capacity_blocks", "tier")
    resident = cur.by("kvobs_tier_resident_blocks", "tier", "state")
    resident_bytes = cur.by("kvobs_tier_resident_bytes", "tier", "state")
    capacity_bytes = cur.by("kvobs_tier_capacity_bytes", "tier")
    for (tier,) in sorted(capacities, key=lambda key: (tier_order(key[0]), key[0])):
        tiers.append(TierView(
            tier, capacities[(tier,)],
            resident.get((tier, "in_use"), 0.0), resident.get((tier, "cached"), 0.0),
            capacity_bytes.get((tier,), 0.0),
            resident_bytes.get((tier, "in_use"), 0.0), resident_bytes.get((tier, "cached"), 0.0),
        ))

    totals = {o: cur.total("kvobs_lookup_tokens_total", outcome=o) for o in OUTCOMES}
    recent = {o: rate("kvobs_lookup_tokens_total", outcome=o) for o in OUTCOMES}
    hits_since_start = not any(recent.values())
    lookup_tokens = totals if hits_since_start else recent

    transfers = []
    directions = set(cur.by("kvobs_transfer_blocks_total", "src_tier", "dst_tier"))
    directions |= set(cur.by("kvobs_transfer_drops_total", "src_tier", "dst_tier"))
    for src, dst in sorted(directions, key=lambda d: (tier_order(d[0]), tier_order(d[1]), d)):
        match = {"src_tier": src, "dst_tier": dst}
        now = _buckets(cur, src, dst)
        window = now
        since_start = True
        if prev is not None:
            before = _buckets(prev, src, dst)
            grown = {le: _delta(c, before.get(le)) for le, c in now.items()}
            if grown and max(grown.values()) > 0:
                window, since_start = grown, False
        transfers.append(TransferView(
            src, dst,
            rate("kvobs_transfer_bytes_total", **match),
            rate("kvobs_transfer_blocks_total", **match),
            quantile(0.5, window), quantile(0.99, window), since_start,
            rate("kvobs_transfer_drops_total", **match),
            rate("kvobs_transfer_failures_total", **match),
            cur.total("kvobs_transfer_drops_total", **match),
            cur.total("kvobs_transfer_failures_total", **match),
        ))

    return EndpointView(
        url=cur.url,
        title=_title(cur),
        interval_s=dt,
        tiers=tiers,
        lookup_tokens=lookup_tokens,
        hits_since_start=hits_since_start,
        lookups_per_s=rate("kvobs_lookups_total") if dt else None,
        transfers=transfers,
        thrash_per_s=rate("kvobs_thrash_onloads_total") if dt else None,
        thrash=cur.total("kvobs_thrash_onloads_total"),
        reused=cur.total("kvobs_offloaded_reused_blocks_total"),
        evicted_unused=cur.total("kvobs_offloaded_evicted_unused_blocks_total"),
        instrumentation_errors=cur.total("kvobs_instrumentation_errors_total"),
    )
