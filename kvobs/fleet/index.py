"""Which replica holds which KV block in which tier, from the engines' KV events.

:class:`FleetIndex` is fed the events of every replica of a fleet (vLLM's and SGLang's
``BlockStored`` / ``BlockRemoved`` / ``AllBlocksCleared``, decoded by
:mod:`kvobs.fleet.wire`) and keeps, for the blocks it follows, the replicas and tiers that
hold each one now and the replicas that held it before. From that it answers:

* **residency**: blocks per replica and tier;
* **duplication**: per tier, the blocks held by two or more replicas and the copies
  beyond the first (capacity the fleet spends holding one block twice);
* **why a replica computed a block** (a ``BlockStored`` on its GPU): ``routing`` (another
  replica held it, in any tier: a router aware of prefixes would have sent the request
  there), ``evicted`` (this replica held it before and lost it), ``evicted_elsewhere``
  (only other replicas held it, and lost it), ``cold`` (no replica held it before). A GPU
  store of a block the replica holds in a lower tier is a load from that tier, not a
  computation; one of a block already on its GPU is a reuse report (vLLM's
  ``kv_cache_report_mode="full"``).

**Sampling.** One aggregator follows a whole fleet by following a share of the blocks: a
block is followed when a mix of its hash (with a salt, the same fleet-wide) falls under
the sampling rate, so every replica's copy of a block is followed or none is, and counts
scale by the inverse of the rate (spatial sampling, as SHARDS). The same mix splits the
hash space into shards, so several aggregators can divide a fleet between them: shard
``i`` of ``n`` follows the sampled blocks whose mix falls in its range; their series add
up.

**The pooled what-if** (``pooled_capacity``): every block any replica stores to its GPU,
in arrival order, is a reference to one LRU cache of the fleet's GPU blocks (a
:class:`~kvobs.reuse.ReuseProfile`, memory-bounded on its own), so its hits at each size
say what the fleet would hit if its caches acted as one (perfect prefix routing). A hit
on a replica's own GPU is a store only where the engine reports its prefix hits (vLLM's
``kv_cache_report_mode="full"``); without them the curve misses the hits' recency.

**Memory.** The blocks held now are bounded by the fleet's capacity times the rate; the
blocks held before are kept for the ``history_keys`` most recently touched (the oldest is
forgotten, and counted, when another arrives): a forgotten block's next computation reads
``cold``.

Example:
    >>> index = FleetIndex()
    >>> a, b = index.replica("a"), index.replica("b")
    >>> index.stored(a, "gpu", [11, 12], block_size=16)
    >>> index.stored(b, "gpu", [11, 13], block_size=16)
    >>> index.computed_tokens[b]["routing"], index.computed_tokens[b]["cold"]
    (16, 16)
    >>> index.duplicated("gpu")
    (1.0, 1.0)
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from kvobs.errors import ConfigError
from kvobs.reuse import ReuseProfile
from kvobs.tiers import DISK, GPU, HOST

#: Why a replica computed a block it stored to its GPU; see the module's docstring.
ROUTING, EVICTED, EVICTED_ELSEWHERE, COLD = "routing", "evicted", "evicted_elsewhere", "cold"
CAUSES: tuple[str, ...] = (ROUTING, EVICTED, EVICTED_ELSEWHERE, COLD)

#: The kinds of event the index applies (:mod:`kvobs.fleet.wire` reads them).
STORED, REMOVED, CLEARED = "stored", "removed", "cleared"
#: One event: ``(kind, tier, block keys, tokens a block)``.
Event = tuple[str, str, list[int], int]

#: Tiers the index knows, in bit order; events name theirs by medium (:mod:`kvobs.fleet.wire`).
REMOTE = "remote"
TIERS: tuple[str, ...] = (GPU, HOST, DISK, REMOTE)
_BIT = {tier: 1 << n for n, tier in enumerate(TIERS)}
_GPU_BIT = _BIT[GPU]

_M64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
#: Blocks held before, per index: about 100 bytes each in CPython.
HISTORY_KEYS = 1 << 20


@dataclass(frozen=True)
class Sampling:
    """Which blocks one aggregator follows: ``rate`` of them (1 follows every block), in
    shard ``shard`` of ``shards``; ``salt`` is the same on every aggregator of a fleet."""

    rate: float = 1.0
    salt: int = 0
    shard: int = 0
    shards: int = 1

    def __post_init__(self) -> None:
        if not 2.0**-20 <= self.rate <= 1.0:
            raise ConfigError(f"sampling rate {self.rate!r} is out of range: use a rate "
                              "between 2**-20 and 1 (1 follows every block)")
        if not 0 <= self.salt <= _M64:
            raise ConfigError(f"sampling salt {self.salt!r} is out of range: use an integer "
                              "from 0 to 2**64-1, the same on every aggregator")
        if not (1 <= self.shards <= 4096 and 0 <= self.shard < self.shards):
            raise ConfigError(f"shard {self.shard}/{self.shards} is invalid: use I/N with "
                              "0 <= I < N <= 4096")

    @property
    def threshold(self) -> int:
        """Blocks whose mix's top 32 bits fall under this are sampled."""
        return round(self.rate * (1 << 32))

    def followed(self, keys: Iterable[int]) -> list[int]:
        """The keys of ``keys`` this aggregator follows: those whose 64-bit multiplicative
        hash (Knuth's, by the golden ratio, of the key with the salt) has its top half
        under :attr:`threshold` and its bottom half in this shard's range. Block hashes are
        digests already; the hash only spreads the salt through them."""
        salt, threshold, shard, shards = self.salt, self.threshold, self.shard, self.shards
        return [key for key in keys
                if (mixed := ((key ^ salt) * _GOLDEN) & _M64) >> 32 < threshold
                and ((mixed & 0xFFFFFFFF) * shards) >> 32 == shard]


class FleetIndex:
    """The followed blocks' holders, and the counts the fleet's series read.

    Not thread-safe: one thread feeds it (:class:`kvobs.fleet.subscriber.Subscriber`) and
    collections read its counts under that thread's lock.
    """

    def __init__(self, sampling: Sampling | None = None,
                 history_keys: int = HISTORY_KEYS, pooled_capacity: int | None = None) -> None:
        if history_keys < 1:
            raise ConfigError(f"history_keys {history_keys!r} must be at least 1")
        #: The pooled what-if: every block any replica stores to its GPU, in arrival
        #: order, as references to one LRU cache of the fleet's GPU blocks.
        self.pooled = None if pooled_capacity is None else ReuseProfile(pooled_capacity)
        self.sampling = sampling or Sampling()
        self.history_keys = history_keys
        self.names: list[str] = []
        #: Per replica: followed blocks resident per tier.
        self.resident: list[dict[str, int]] = []
        #: Per replica: followed blocks stored and removed per tier (events, not blocks held).
        self.stored_blocks: list[dict[str, int]] = []
        self.removed_blocks: list[dict[str, int]] = []
        #: Per replica: tokens of followed blocks computed, per cause; loaded from one of
        #: its own lower tiers, per tier; reported reused on its GPU.
        self.computed_tokens: list[dict[str, int]] = []
        self.loaded_tokens: list[dict[str, int]] = []
        self.reused_tokens: list[int] = []
        self.clears: list[int] = []
        #: Per replica: tokens a block, from its last store that said.
        self.block_size: list[int] = []
        #: Per tier: followed blocks on one replica at least, on two or more, and the copies
        #: beyond the first.
        self._distinct = dict.fromkeys(TIERS, 0)
        self._duplicated = dict.fromkeys(TIERS, 0)
        self._extra = dict.fromkeys(TIERS, 0)
        self.history_forgotten = 0
        self._holders: dict[int, dict[int, int]] = {}
        #: Blocks some replica held and no longer holds: key -> bit set of those replicas,
        #: least recently dropped first.
        self._held_before: dict[int, int] = {}
        self._sampled = self.sampling.rate < 1.0 or self.sampling.shards > 1

    @property
    def scale(self) -> float:
        """What one followed block stands for."""
        return 1.0 / self.sampling.rate

    def replica(self, name: str) -> int:
        """The index of replica ``name``, added on first use."""
        if name in self.names:
            return self.names.index(name)
        self.names.append(name)
        self.resident.append(dict.fromkeys(TIERS, 0))
        self.stored_blocks.append(dict.fromkeys(TIERS, 0))
        self.removed_blocks.append(dict.fromkeys(TIERS, 0))
        self.computed_tokens.append(dict.fromkeys(CAUSES, 0))
        self.loaded_tokens.append(dict.fromkeys(TIERS, 0))
        self.reused_tokens.append(0)
        self.clears.append(0)
        self.block_size.append(0)
        return len(self.names) - 1

    def apply(self, replica: int, events: Iterable[Event]) -> None:
        """Replica ``replica``'s events, in order."""
        for kind, tier, keys, block_size in events:
            if kind == STORED:
                self.stored(replica, tier, keys, block_size)
            elif kind == CLEARED:
                self.cleared(replica, tier)
            else:
                self.removed(replica, tier, keys)

    def stored(self, replica: int, tier: str, keys: Iterable[int], block_size: int) -> None:
        """Replica ``replica`` stored blocks ``keys`` of ``block_size`` tokens in ``tier``
        (``BlockStored``; a size of 0, unknown, reads as the replica's last known one)."""
        if block_size:
            self.block_size[replica] = block_size
        else:
            block_size = self.block_size[replica]
        bit = _BIT[tier]
        if self.pooled is not None and tier == GPU:
            keys = list(keys)
            self.pooled.reference(keys)
        if self._sampled:
            keys = self.sampling.followed(keys)
        for key in keys:
            holders = self._holders.get(key)
            if holders is None:
                holders = self._holders[key] = {}
            mine = holders.get(replica, 0)
            if tier == GPU:
                self._classify(replica, key, holders, mine, block_size)
            if mine & bit:
                continue  # held already: a reuse report, or a duplicate event
            self._count_tier(tier, holders, +1)
            holders[replica] = mine | bit
            self.resident[replica][tier] += 1
            self.stored_blocks[replica][tier] += 1

    def _classify(self, replica: int, key: int, holders: dict[int, int], mine: int,
                  block_size: int) -> None:
        if mine & _GPU_BIT:
            self.reused_tokens[replica] += block_size
        elif mine:
            lower = TIERS[(mine & -mine).bit_length() - 1]  # its fastest tier holding it
            self.loaded_tokens[replica][lower] += block_size
        else:
            if holders:  # others hold it (this replica holds it in no tier)
                cause = ROUTING
            else:
                held = self._held_before.get(key, 0)
                cause = EVICTED if held >> replica & 1 else \
                    EVICTED_ELSEWHERE if held else COLD
            self.computed_tokens[replica][cause] += block_size

    def removed(self, replica: int, tier: str, keys: Iterable[int]) -> None:
        """Replica ``replica`` removed blocks ``keys`` from ``tier`` (``BlockRemoved``); a
        block it did not hold there (stored before the index followed it) is ignored."""
        bit = _BIT[tier]
        for key in keys:
            holders = self._holders.get(key)
            if holders is None:
                continue
            mine = holders.get(replica, 0)
            if not mine & bit:
                continue
            self._drop(replica, key, holders, mine, bit, tier)
            self.removed_blocks[replica][tier] += 1

    def cleared(self, replica: int, tier: str) -> None:
        """Replica ``replica`` dropped every block of ``tier`` (``AllBlocksCleared``)."""
        self.clears[replica] += 1
        self.forget_replica(replica, (tier,))

    def forget_replica(self, replica: int, tiers: Iterable[str] = TIERS) -> None:
        """Drop what ``replica`` holds in ``tiers`` (it restarted, or its events can no
        longer be followed)."""
        for key, holders in list(self._holders.items()):
            mine = holders.get(replica, 0)
            for tier in tiers:
                if mine & _BIT[tier]:
                    mine = self._drop(replica, key, holders, mine, _BIT[tier], tier)

    def _drop(self, replica: int, key: int, holders: dict[int, int], mine: int, bit: int,
              tier: str) -> int:
        holders[replica] = mine = mine & ~bit
        if not mine:
            del holders[replica]
            if not holders:
                del self._holders[key]
            self._remember(key, replica)
        self._count_tier(tier, holders, -1)
        self.resident[replica][tier] -= 1
        return mine

    def _count_tier(self, tier: str, holders: dict[int, int], step: int) -> None:
        """Before one replica gains (``+1``) or after it lost (``-1``) ``tier``'s copy:
        moves the tier's distinct, duplicated and extra-copy counts."""
        bit = _BIT[tier]
        others = sum(1 for mask in holders.values() if mask & bit)
        if others == 0:
            self._distinct[tier] += step
        else:
            self._extra[tier] += step
            if others == 1:
                self._duplicated[tier] += step

    def _remember(self, key: int, replica: int) -> None:
        """``replica`` no longer holds ``key`` in any tier: remember it did (newest last;
        the oldest memory goes when the bound is reached)."""
        held = self._held_before.pop(key, 0)
        self._held_before[key] = held | 1 << replica
        if len(self._held_before) > self.history_keys:
            del self._held_before[next(iter(self._held_before))]
            self.history_forgotten += 1

    def distinct(self, tier: str) -> float:
        """Blocks (estimated) held in ``tier`` by one replica at least."""
        return self._distinct[tier] * self.scale

    def duplicated(self, tier: str) -> tuple[float, float]:
        """Blocks (estimated) held in ``tier`` by two or more replicas, and the copies of
        them beyond the first."""
        return self._duplicated[tier] * self.scale, self._extra[tier] * self.scale

    def pooled_hits(self) -> list[tuple[float, float]]:
        """``(cache size in blocks, blocks a pooled LRU cache of that size would have hit)``
        at the profile's bounds (1/8 to 16 times the pooled capacity), and the blocks
        referenced (``inf``); empty without the pooled what-if."""
        if self.pooled is None:
            return []
        return [(bound, hits / self.pooled.rate) for bound, hits in self.pooled.cumulative()]

    @property
    def followed_blocks(self) -> int:
        """Blocks held now that the index follows (its memory)."""
        return len(self._holders)

    @property
    def history_blocks(self) -> int:
        """Blocks the index remembers as held before by a replica not holding them now."""
        return len(self._held_before)
