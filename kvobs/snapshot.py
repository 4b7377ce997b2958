"""Frozen, point-in-time views of the recorder, read by every sink.

Sinks never touch the live counters: they take a :class:`RecorderSnapshot` and read
plain values from it. Snapshots import no telemetry library.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class TierSnapshot:
    """Counters and occupancy of one tier."""

    tier: str
    capacity_blocks: int
    block_tokens: int
    block_bytes: int
    allocations: int
    frees: int
    frees_to_cache: int
    reuses: int
    stores: int
    evictions: Mapping[str, int]
    in_use_blocks: int
    cached_blocks: int

    @property
    def resident_blocks(self) -> int:
        """Blocks holding KV data (in use or cached)."""
        return self.in_use_blocks + self.cached_blocks

    @property
    def free_blocks(self) -> int:
        """Blocks holding nothing: capacity minus resident."""
        return self.capacity_blocks - self.resident_blocks

    @property
    def occupancy(self) -> float:
        """Resident fraction of capacity (0 for a tier of no capacity)."""
        return self.resident_blocks / self.capacity_blocks if self.capacity_blocks else 0.0

    @property
    def evictions_total(self) -> int:
        """Evictions summed over reasons."""
        return sum(self.evictions.values())


@dataclass(frozen=True)
class LinkSnapshot:
    """Counters of transfers in one direction (src tier -> dst tier)."""

    src: str
    dst: str
    operations: int
    blocks: int
    bytes: int
    failures: int
    drops: int
    seconds: float
    counts: bool = True  # False: a timing-only link (see LinkRecorder)


#: Why a looked-up token missed every tier (``kvobs_miss_tokens_total{cause}``), in order:
#: ``cold``: its block was first seen within the reuse profile's horizon (16x the capacity);
#: ``evicted``: seen before, farther back than the tiers' capacity (an LRU cache of that
#: size had evicted it; more capacity wins it back, the what-if curve says how much);
#: ``dropped``: seen within the capacity, its offload refused by a full tier (an adapter
#: that tells); ``in_flight``: seen within the capacity, its offload still being written at
#: the lookup; ``other``: seen within the capacity, missed all the same (what the LRU model
#: does not explain: an eviction policy other than LRU); ``not_cacheable``: tokens of no
#: whole block the engine could hit (a partial last block, vLLM's always-computed last
#: token); ``unknown``: looked up without block keys (an adapter that reports none, or the
#: reuse profile off).
MISS_CAUSES = ("cold", "evicted", "dropped", "in_flight", "other", "not_cacheable",
               "unknown")


@dataclass(frozen=True)
class LookupSnapshot:
    """Prefix lookups counted in tokens, by where the tokens were found."""

    lookups: int
    tokens: int
    gpu_hit: int
    host_hit: int
    disk_hit: int
    #: missed tokens per :data:`MISS_CAUSES` (summing to :attr:`miss`), or None where
    #: not kept (re-lookups)
    causes: tuple[int, ...] | None = None
    #: of the evicted missed tokens, those an LRU cache of twice the capacity would hit
    recoverable: int = 0

    @property
    def miss(self) -> int:
        """Tokens found in no tier (they must be recomputed)."""
        return self.tokens - self.gpu_hit - self.host_hit - self.disk_hit

    def outcomes(self) -> dict[str, int]:
        """Tokens per outcome label; the values sum to :attr:`tokens`."""
        return {
            "gpu_hit": self.gpu_hit,
            "host_hit": self.host_hit,
            "disk_hit": self.disk_hit,
            "miss": self.miss,
        }

    def miss_causes(self) -> dict[str, int]:
        """Missed tokens per cause (:data:`MISS_CAUSES`); the values sum to :attr:`miss`.

        Example:
            >>> LookupSnapshot(1, 64, 16, 0, 0, (32, 0, 0, 0, 0, 16, 0)).miss_causes()["cold"]
            32
        """
        causes = self.causes if self.causes is not None else \
            (0,) * (len(MISS_CAUSES) - 1) + (self.miss,)
        return dict(zip(MISS_CAUSES, causes, strict=True))


@dataclass(frozen=True)
class ThrashSnapshot:
    """Whether offloading pays off: re-onloads inside the window, reuse, wasted offloads."""

    onloads_in_window: int
    offloaded_reused: int
    offloaded_evicted_unused: int
    tracked_blocks: int
    untracked_blocks: int


@dataclass(frozen=True)
class BenefitSnapshot:
    """What the slower tiers' hits saved: prefill seconds, at the current cost per token."""

    host_saved_s: float
    disk_saved_s: float
    prefill_seconds_per_token: float
    prefill_cost_source: str
    #: relative standard error of the measured fit (inf: no fit yet, or none possible)
    prefill_cost_relative_error: float = float("inf")


@dataclass(frozen=True)
class ReuseSnapshot:
    """The reuse-distance profile: counted references per distance bound (cumulative), in
    samples at ``rate`` (see :attr:`kvobs.reuse.ReuseProfile.sampled`)."""

    capacity_blocks: int
    rate: float
    references: int
    cumulative: tuple[tuple[float, float], ...]  # (bound in blocks, counted refs <= bound)
    forgotten: int = 0  # tracked blocks dropped by the profile's memory bound
    tracking_rate: float = 1.0  # share of blocks tracked now (1: exact distances)
    exact_blocks: int = 0  # distances up to this many blocks counted exactly now


@dataclass(frozen=True)
class RecorderSnapshot:
    """Everything a sink exports, read at one moment."""

    engine: str
    model: str
    tiers: tuple[TierSnapshot, ...]
    links: tuple[LinkSnapshot, ...]
    lookups: LookupSnapshot
    thrash: ThrashSnapshot
    errors: Mapping[str, int]
    dropped_samples: int
    benefit: BenefitSnapshot = BenefitSnapshot(0.0, 0.0, 0.0, "none")
    reuse: ReuseSnapshot | None = None
    #: re-lookups of preempted requests (None: the adapter does not tell them apart)
    relookups: LookupSnapshot | None = None

    def tier(self, name: str) -> TierSnapshot:
        """The snapshot of tier ``name`` (KeyError if absent)."""
        for tier in self.tiers:
            if tier.tier == name:
                return tier
        raise KeyError(name)

    def link(self, src: str, dst: str) -> LinkSnapshot:
        """The snapshot of direction ``src -> dst`` (KeyError if absent)."""
        for link in self.links:
            if (link.src, link.dst) == (src, dst):
                return link
        raise KeyError((src, dst))
