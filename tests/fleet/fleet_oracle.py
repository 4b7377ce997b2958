"""A plain replay of a fleet's events, the account the index's counts are checked with:
sets per replica and tier, and every holder a block ever had (no bound, no sampling)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

TIERS = ("gpu", "host", "disk", "remote")


@dataclass
class FleetOracle:
    held: dict[tuple[int, str], set[int]] = field(default_factory=dict)
    ever: dict[int, set[int]] = field(default_factory=dict)  # key -> replicas that held it
    computed: Counter[tuple[int, str]] = field(default_factory=Counter)
    loaded: Counter[tuple[int, str]] = field(default_factory=Counter)
    reused: Counter[int] = field(default_factory=Counter)

    def tier(self, replica: int, tier: str) -> set[int]:
        return self.held.setdefault((replica, tier), set())

    def holds(self, replica: int, key: int) -> list[str]:
        return [t for t in TIERS if key in self.tier(replica, t)]

    def replicas(self) -> set[int]:
        return {replica for replica, _ in self.held}

    def stored(self, replica: int, tier: str, keys: list[int], block_size: int) -> None:
        for key in keys:
            if tier == "gpu":
                mine = self.holds(replica, key)
                if "gpu" in mine:
                    self.reused[replica] += block_size
                elif mine:
                    self.loaded[(replica, mine[0])] += block_size
                else:
                    others = [r for r in self.replicas() if r != replica and self.holds(r, key)]
                    before = self.ever.get(key, set())
                    cause = ("routing" if others else "evicted" if replica in before
                             else "evicted_elsewhere" if before else "cold")
                    self.computed[(replica, cause)] += block_size
            self.tier(replica, tier).add(key)
            self.ever.setdefault(key, set()).add(replica)

    def removed(self, replica: int, tier: str, keys: list[int]) -> None:
        self.tier(replica, tier).difference_update(keys)

    def cleared(self, replica: int, tier: str) -> None:
        self.tier(replica, tier).clear()

    def copies(self, tier: str) -> Counter[int]:
        """Per block, how many replicas hold it in ``tier``."""
        counts: Counter[int] = Counter()
        for (_, t), keys in self.held.items():
            if t == tier:
                counts.update(keys)
        return counts
