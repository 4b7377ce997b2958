"""Reuse distance, online and cheap: what hit ratio would a cache of N blocks get?

For every block reference at the prefix lookup, its *reuse distance* is its LRU stack
position: 1 + the number of distinct other blocks referenced since its previous
reference (cold references, never seen before, have none). An LRU cache of ``C``
blocks hits exactly the references whose distance is ``<= C``, so one profile answers
"what if the pool were 2x larger?" for every size at once (Mattson et al., 1970).

Which references count. The profile models the engine's cache as one LRU stack of
blocks. Two kinds of events move a block to the top of that stack:

* a *lookup* reference (:meth:`ReuseProfile.reference`): a block of a prompt looked up at
  admission. These are what the hit ratio is about: each one is counted, hit if its
  distance is ``<= C``;
* a *write* (:meth:`ReuseProfile.write`): a block the cache gains that no lookup
  referenced: blocks written during decode (vLLM's, reported when the request
  releases its blocks; the reference pool's at release). They are not counted (nobody
  looked them up), but they occupy the cache and the next turn's prompt hits them, so
  without them a returning conversation's last answer would look cold.

Prompt blocks computed at prefill are the lookup's own misses, and an offload landing
copies a block the profile already holds: neither adds a block to the stack.

Computing it exactly needs memory for every distinct block. :class:`ReuseProfile` keeps
two LRU stacks. The *exact* one holds the ``exact_keys`` most recently used blocks
(131,072 by default; the least recently used one is forgotten when another arrives): a
reference whose distance is at most that is found there with its exact distance, whatever
the profile has seen before, so every bucket bound up to it is exact for as long as the
engine runs (at a capacity of 10,000 blocks, 13 of the 14 bounds; at 100,000, those up to
1.25x). The *sampled* one answers the bounds beyond it. It tracks every block too until
``max_keys`` distinct blocks (131,072 by default) have been seen: above the sampling rate
nothing is forgotten, so blocks used once count toward the bound as much as blocks in use,
and the share, once halved, never rises again (an engine serving many distinct prompts
reaches the rate within minutes). From then on it follows SHARDS
(Waldspurger et al., FAST'15) with a fixed memory bound: a block is tracked only if a hash
of its key falls under a threshold (spatial sampling: all references of a
tracked block are kept, none of the others), distances between tracked blocks are scaled
by the inverse of the tracked share and capped by the references (every key, tracked or
not) since the block's last use, as no more distinct blocks can lie between (so a loop of
exactly a bucket bound's length lands on its side of the bound), and each tracked
reference counts for as many references as the share stands for. The tracked share starts
at 1 (every block: exact distances) and is halved, dropping the blocks above the new
threshold, each time ``max_keys`` blocks are tracked and another arrives, down to the
*rate* ``R``: the largest power of two (at most 1) whose ``max_keys / R`` covers the
largest distance of interest (the horizon, 16x the configured capacity). At ``R``, when
more blocks than ``max_keys`` are live the least recently used one is forgotten
(:attr:`forgotten`; its next reference is beyond the horizon: a miss at every size of
interest, as it would be anyway). Counts are kept in samples at ``R`` whatever the
tracked share (a tracked reference at share ``S`` adds ``R / S``; an exact one ``R``), so
the exported counters have one unit: the rate depends only on the capacity, engines of
one size share it and their counters add up. With the exact stack, every reference is
looked up there first; one found there is counted there (each weighing ``R``), and the
sampled stack only moves it to its top. Of the others (farther than ``exact_keys``, or
cold), the sampled stack counts the tracked ones at their scaled distance (at least
``exact_keys`` + 1), each standing for as many of them as there were per tracked one since
the tracked share last changed: a ratio estimate, so the counts add up to about every
reference whether the sample holds more or fewer of them than the rate expects (the
imbalance SHARDS-adj credits to the shortest distances, which are exact here). A bucket
beyond ``exact_keys`` is then every reference the exact stack found plus the sampled
stack's count up to its bound; the exported counters all only grow, and the sum of the
buckets is every reference times ``R`` (the SHARDS-adj correction is 0). At rate 1
(capacities up to
8,192 blocks, whose largest bound fits in ``max_keys``) the one stack is exact and no
second one is kept. The exact stack costs about as much per key as the sampled one while
it tracks every block, and up to ~7.5 MB when full. Per reference the hot path pays one
hash and compare; a tracked one an order-statistics query on a Fenwick tree (in each
stack that tracks it): ~0.1-0.3 us in the C core (``ReuseCore``, kernels/reuse.c).

Prefix semantics: engines stop matching at a request's first missing block. Under LRU
with prefix-structured keys this needs no special case: a block's ancestors are
referenced just before it in every request that uses it, so they are always more recent
in the stack and a block after a miss is a miss too.

Example:
    >>> profile = ReuseProfile(capacity_blocks=4, rate=1.0)
    >>> for request in (["a", "b", "c"], ["a", "b", "d"], ["a", "b", "c"]):
    ...     profile.reference(request)
    >>> profile.write(["e"])  # written during decode: occupies the cache, not counted
    >>> profile.reference(["a", "b", "e"])
    >>> profile.references, profile.hit_ratio(2), round(profile.hit_ratio(3), 3)
    (12, 0.0, 0.417)
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Hashable, Sequence
from typing import Any

from kvobs.errors import ConfigError
from kvobs.kernels._ext import native

_SPACE = 1 << 24  # the sampling threshold's resolution

#: Bucket bounds as multiples of the configured capacity (cold references: +Inf).
BUCKET_FACTORS: tuple[float, ...] = (
    0.125, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0,
)
DEFAULT_MAX_KEYS = 1 << 17
#: Most ``max_keys`` a profile takes (the C core's tables are indexed by 32-bit slots).
MAX_KEYS_LIMIT = 1 << 28
#: Highest default sampling rate: exact tracking while the horizon fits in ``max_keys``.
DEFAULT_MAX_RATE = 1.0


def default_rate(capacity_blocks: int, max_keys: int = DEFAULT_MAX_KEYS,
                 max_rate: float = DEFAULT_MAX_RATE) -> float:
    """The largest power-of-two rate <= ``max_rate`` whose horizon ``max_keys / rate``
    covers 16x ``capacity_blocks`` (engines of one size share a rate, so their profiles
    add up across a fleet)."""
    rate = max_rate
    while rate > 1 / _SPACE and max_keys / rate < BUCKET_FACTORS[-1] * capacity_blocks:
        rate /= 2
    return rate


class ReuseProfile:
    """A reuse-distance profile of block references with a fixed memory bound: exact for
    every distance up to ``exact_keys`` blocks, and beyond it exact until ``max_keys``
    distinct blocks have been tracked, sampled from then on.

    Args:
        capacity_blocks: the configured cache size (the distinct blocks the tiers hold)
            in lookup blocks; the exported buckets are :data:`BUCKET_FACTORS` times it.
        rate: the lowest tracked share, and the unit of the counts, in [2**-24, 1] (taken
            to the nearest multiple of 2**-24, the sampling hash's resolution); default
            :func:`default_rate`.
        max_keys: most blocks tracked at once.
        keep_samples: also keep every counted distance (offline what-if: any size
            can then be read exactly instead of at bucket bounds; 16 bytes a counted
            reference, so not for an engine that runs for days).
        adaptive: track every block at first, and halve the tracked share down to
            ``rate`` only as ``max_keys`` fills (exact until then; never raised again);
            ``False`` tracks the blocks sampled at ``rate`` alone (plain SHARDS).
        exact_keys: the blocks of the exact LRU stack kept beside the sampled one (every
            distance up to it exact, at any age); default ``max_keys`` where the rate is
            below 1, none with ``keep_samples``; 0: none (the sample alone).

    Raises:
        ConfigError: a non-positive capacity, rate outside (0, 1], ``max_keys`` or
            ``exact_keys`` out of range.
    """

    def __init__(self, capacity_blocks: int, rate: float | None = None,
                 max_keys: int = DEFAULT_MAX_KEYS, keep_samples: bool = False,
                 adaptive: bool = True, exact_keys: int | None = None) -> None:
        if isinstance(capacity_blocks, bool) or not isinstance(capacity_blocks, int) \
                or capacity_blocks <= 0:
            raise ConfigError(f"reuse profile: capacity_blocks must be a positive integer, "
                              f"got {capacity_blocks!r}")
        if not 0 < max_keys <= MAX_KEYS_LIMIT:
            raise ConfigError(f"reuse profile: max_keys must be in [1, 2**28], got "
                              f"{max_keys!r}")
        rate = default_rate(capacity_blocks, max_keys) if rate is None else rate
        if not 1 / _SPACE <= rate <= 1:
            raise ConfigError(f"reuse profile: rate must be in [2**-24, 1] (the sampling "
                              f"hash's resolution), got {rate!r}")
        if exact_keys is not None and not 0 <= exact_keys <= MAX_KEYS_LIMIT:
            raise ConfigError(f"reuse profile: exact_keys must be in [0, 2**28] (0: none), "
                              f"got {exact_keys!r}")
        self.capacity_blocks = capacity_blocks
        self._threshold = round(rate * _SPACE)  # counted: hash bits below it
        #: the share the threshold samples: ``rate`` as given when a multiple of 2**-24
        #: (every power of two is), else the nearest such share (the counts' unit)
        self.rate = self._threshold / _SPACE
        self.max_keys = max_keys
        self.bounds: tuple[int, ...] = tuple(sorted(
            {max(1, round(f * capacity_blocks)) for f in BUCKET_FACTORS}))
        self._weight = 1.0 / self.rate
        #: whether every counted distance is kept (:meth:`hit_ratio` then reads any size)
        self.keep_samples = keep_samples
        if exact_keys is None:  # by default where this profile samples and runs online
            exact_keys = max_keys if not keep_samples else 0
        #: the most recent blocks whose distances are exact whatever the rate (an exact
        #: LRU stack of that many blocks fed every key, beside the sampled one): the
        #: buckets up to it read from there; 0 at rate 1, where this profile is exact
        self.exact_keys = exact_keys if self.rate < 1 and not keep_samples else 0
        self._near = ReuseProfile(capacity_blocks, rate=1.0, max_keys=self.exact_keys,
                                  adaptive=False, exact_keys=0) if self.exact_keys else None
        # tracked (recency kept, distances measured among them): from every block, halved
        # down to the counted ones as max_keys fills
        track = _SPACE if adaptive else self._threshold
        self._core: Any = native.ReuseCore(
            max_keys, self._threshold, self._weight, self.bounds, track,
            None if self._near is None else self._near.core, samples=keep_samples)
        #: ``record(keys, counted)``: :meth:`reference` (counted) or :meth:`write` in one
        #: call, the C core's own method (no Python frame per lookup).
        self.record: Callable[[Sequence[Hashable], bool], None] = self._core.reference
        #: ``written_then_reference(written, keys[, miss_from, miss_to, capacity])``: the
        #: blocks written since the last lookup (a list, emptied), then a lookup's keys;
        #: one C call. Given the lookup's missed keys (``keys[miss_from:miss_to]``) and a
        #: capacity in blocks, it returns their causes ``(cold, evicted, other,
        #: recoverable)``: first seen within the horizon (16x the capacity; a block last
        #: seen beyond it reads cold too), seen farther back than the capacity, or within
        #: it (an LRU cache of that size would have kept it), and of the evicted ones
        #: those within twice the capacity. Exact for every key the profile tracks; an
        #: untracked one (sampled out) is cold or evicted (never recoverable) in the
        #: proportion of the last tracked ones beyond the exact stack (about 32 of them);
        #: a list ``kept_at`` after the capacity gets the within-capacity keys' positions.
        self.written_then_reference: Callable[..., tuple[int, int, int, int] | None] = \
            self._core.written_then_reference

    @property
    def core(self) -> Any:
        """The C core (``kvobs.kernels._native.ReuseCore``)."""
        return self._core

    @property
    def tracking_rate(self) -> float:
        """The share of blocks tracked now: 1 (every block: exact distances) down to
        :attr:`rate` as ``max_keys`` fills (adaptive), or :attr:`rate` throughout.

        Example:
            >>> profile = ReuseProfile(64, rate=0.25, max_keys=8)
            >>> profile.reference(range(4)); profile.tracking_rate, profile.sampled
            (1.0, 1.0)
            >>> profile.reference(range(4, 100)); profile.tracking_rate
            0.25
        """
        track = self._core.track
        return self.rate if track == self._threshold else track / _SPACE

    @property
    def exact_blocks(self) -> int:
        """Distances up to this many blocks are counted exactly now (every bucket bound
        up to it is exact): :attr:`exact_keys` with the exact stack; ``max_keys`` while
        the one stack tracks every block (rate 1, or not yet halved); else 0.

        Example:
            >>> ReuseProfile(100_000).exact_blocks, ReuseProfile(1000).exact_blocks
            (131072, 131072)
            >>> ReuseProfile(100_000, exact_keys=0, max_keys=8).exact_blocks
            8
        """
        if self._near is not None:
            return self.exact_keys
        return self.max_keys if self.tracking_rate >= 1.0 else 0

    def reference(self, keys: Sequence[Hashable]) -> None:
        """Blocks ``keys`` (one request's prompt, in order) were looked up: counted.

        Sampling (once ``max_keys`` distinct blocks were tracked) reads the low bits of
        ``hash((key,))``: the tuple hash mixes the key's own hash (cached by bytes keys,
        the value itself for ints), so consecutive ints sample as evenly as digests.
        Which blocks are sampled varies with ``PYTHONHASHSEED``; the estimate does not
        depend on it.
        """
        self.record(keys, True)

    def write(self, keys: Sequence[Hashable]) -> None:
        """Blocks ``keys`` entered the cache without a lookup (written during decode):
        they become the most recent blocks; nothing is counted.

        Example:
            >>> profile = ReuseProfile(capacity_blocks=8, rate=1.0)
            >>> profile.write(["answer"]); profile.reference(["answer"])
            >>> profile.references, profile.hit_ratio(1)
            (1, 1.0)
        """
        self.record(keys, False)

    def _stats(self) -> tuple[int, float, int, int]:
        """``(total, sampled, forgotten, tracked)``; with the exact near profile, sampled
        is exactly ``total * rate`` (what its counts add up to, see :meth:`counts`)."""
        total, sampled, forgotten, tracked = self._core.stats()
        if self._near is not None:
            sampled = total * self.rate
        return total, sampled, forgotten, tracked

    @property
    def total(self) -> int:
        """Counted (lookup) references, tracked or not."""
        return self._stats()[0]

    @property
    def sampled(self) -> float:
        """Counted references, in samples at :attr:`rate`: each weighs ``rate`` over the
        tracking rate then (1 at the rate; 1/16 at rate 1/16 while every block is
        tracked), so that ``sampled`` estimates ``total * rate`` at any tracking rate."""
        return self._stats()[1]

    @property
    def forgotten(self) -> int:
        """Tracked blocks dropped by the ``max_keys`` bound at :attr:`rate` (least
        recently used first; blocks dropped as the tracked share halves are not counted:
        the blocks sampled at the rate are all kept then)."""
        return self._stats()[2]

    @property
    def tracked(self) -> int:
        """Blocks tracked now (at most ``max_keys``)."""
        return self._stats()[3]

    @property
    def references(self) -> int:
        """References looked up (every one, tracked or not)."""
        return self.total

    def counts(self) -> list[float]:
        """Counted references per bucket, in samples at :attr:`rate` (see
        :attr:`sampled`; the last: beyond every bound, or cold).

        With the exact stack (:attr:`exact_keys`), every reference counts ``rate``: a
        bucket up to ``exact_keys`` is the exact stack's count; one beyond it adds the
        sample's count of the references the exact stack did not find (farther than
        ``exact_keys``) to every reference it found, the running sum capped by every
        reference. Each running sum, and so every exported ``le`` counter, only grows."""
        sampled: list[float] = self._core.counts()
        near = self._near
        if near is None:
            return sampled
        rate, everything = self.rate, self._stats()[1]
        exact = near.counts()
        merged, below, within, beyond = [], 0.0, 0.0, 0.0
        for bound, found, far in zip(self.bounds, exact, sampled, strict=False):
            within += found * rate  # found by the exact stack: a distance <= exact_keys
            beyond += far           # sampled beyond it (none within)
            running = within if bound <= self.exact_keys else within + beyond
            running = min(max(running, below), everything)
            merged.append(running - below)
            below = running
        merged.append(everything - below)
        return merged

    def cumulative(self) -> list[tuple[float, float]]:
        """``(bound in blocks, counted references with distance <= bound)`` in samples at
        :attr:`rate`, ending with ``(inf, every counted reference)``: cold references are
        only there."""
        running, rows = 0.0, []
        for bound, count in zip((*self.bounds, float("inf")), self.counts(), strict=True):
            running += count
            rows.append((float(bound), running))
        return rows

    def hit_ratio(self, size_blocks: float) -> float:
        """Predicted LRU hit ratio of block references for a cache of ``size_blocks``.

        SHARDS-adj: the sample holds ``sampled`` references where ``total * rate`` were
        expected (the same while every block is tracked); the difference comes mostly
        from a few hot blocks, whose distances are the shortest, so it is credited to the
        shortest distances. Exact at any size with ``keep_samples`` (and every block
        tracked); otherwise exact at the bucket bounds and interpolated linearly between
        them (from 0 below the first; the last bound's value beyond it).
        """
        total, sampled, _, _ = self._stats()
        if not sampled or total * self.rate <= 0:
            return 0.0
        if self.keep_samples:
            hits = self._core.hits(size_blocks)
            return adjusted_hit_ratio(hits, sampled, total, self.rate)
        points = [(bound, adjusted_hit_ratio(hits, sampled, total, self.rate))
                  for bound, hits in self.cumulative()[:-1]]
        return interpolate(points, size_blocks)


def interpolate(points: Sequence[tuple[float, float]], size: float) -> float:
    """The value at ``size`` of the curve through ``points`` (sorted by bound): linear
    between two bounds, from 0 below the first, flat beyond the last.

    Example:
        >>> interpolate([(10, 0.2), (20, 0.4)], 15), interpolate([(10, 0.2)], 5)
        (0.30000000000000004, 0.1)
    """
    if not points:
        return 0.0
    first_bound, first = points[0]
    if size < first_bound:
        return first * max(size, 0.0) / first_bound
    i = bisect_right([b for b, _ in points], size) - 1
    if i >= len(points) - 1:
        return points[-1][1]
    (b0, h0), (b1, h1) = points[i], points[i + 1]
    return h0 + (h1 - h0) * (size - b0) / (b1 - b0)


def adjusted_hit_ratio(hits: float, sampled: float, total: float, rate: float) -> float:
    """SHARDS-adj hit ratio from sampled hits, sampled and total references and the rate
    (the same formula the ``kvobs:reuse_hit_ratio`` recording rule applies).

    Example:
        >>> adjusted_hit_ratio(hits=50, sampled=110, total=1000, rate=0.1)  # 10 extra
        0.4
    """
    expected = total * rate
    if expected <= 0:
        return 0.0
    return min(max((hits + expected - sampled) / expected, 0.0), 1.0)


def hit_ratios(profile: ReuseProfile, sizes: Sequence[float]) -> list[tuple[float, float]]:
    """``[(size, predicted hit ratio)]`` for each size in blocks."""
    return [(size, profile.hit_ratio(size)) for size in sizes]
