"""The reuse profile's C core (``ReuseCore``, kernels/reuse.c) written out plainly: the
oracle its tests hold it to, counter for counter.

Each rule of the core, from its definition and nothing faster: a key is tracked while the
low 24 bits of ``hash((key,))`` are below ``track``; a tracked reference's distance is
the number of live keys used since the key's previous reference, plus itself, times the
tracked share's weight (scaled, at most the references since); the tracked share halves
(dropping the keys above it) when ``max_keys`` keys are live and another arrives, and at
the rate the least recently used key is forgotten instead. No Fenwick tree, no slots, no
compaction: the live keys' latest reference times in a sorted list.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Hashable, Sequence

SPACE = 1 << 24
LOW_BITS = SPACE - 1
UNTRACKED = -2


class OracleCore:
    """``ReuseCore(max_keys, threshold, weight, bounds, track, near, samples)``, plainly."""

    def __init__(self, max_keys: int, threshold: int, weight: float, bounds: Sequence[float],
                 track: int | None = None, near: OracleCore | None = None,
                 samples: bool = False) -> None:
        self.max_keys, self.threshold, self.weight = max_keys, threshold, weight
        self.bounds = [float(b) for b in bounds]
        self.near, self.keep = near, samples
        self.buckets = [0.0] * (len(self.bounds) + 1)
        self.kept: list[tuple[float, float]] = []  # with samples: (distance, weight)
        self.sampled = 0.0
        self.total = self.forgotten = self.refs = self.clock = 0
        self.live: dict[int, tuple[int, int]] = {}  # key bits -> (time, reference number)
        self.times: list[int] = []  # the live keys' times, ascending
        self.key_at: dict[int, int] = {}  # time -> key bits
        self.set_track(threshold if track is None else track)

    def set_track(self, track: int) -> None:
        at_rate = track == self.threshold
        self.track = track
        self.far_refs = self.far_tracked = 0
        self.track_weight = self.weight if at_rate else SPACE / track
        self.count_weight = 1.0 if at_rate else self.track_weight / self.weight

    def stats(self) -> tuple[int, float, int, int]:
        return self.total, self.sampled, self.forgotten, len(self.live)

    def counts(self) -> list[float]:
        return list(self.buckets)

    def hits(self, size: float) -> float:
        return sum(w for d, w in self.kept if d <= size)

    def written_then_reference(self, written: list[Hashable], keys: Sequence[Hashable]) -> None:
        if written:
            taken = written[:]
            written.clear()
            self.reference(taken, False)
        self.reference(keys, True)

    def reference(self, keys: Sequence[Hashable], counted: bool = True) -> None:
        keys = keys if isinstance(keys, (list, tuple)) else list(keys)
        n = len(keys)
        if counted:
            self.total += n
        every = []  # read live, at most the call's length: a key's __hash__ may change it
        for i in range(n):
            if i >= len(keys):
                break
            every.append(hash((keys[i],)) & (2**64 - 1))
        picked = [(i, bits) for i, bits in enumerate(every) if bits & LOW_BITS < self.track]
        first = self.refs + 1  # the call's i-th key (from 0) is reference number first + i
        self.refs += len(every)
        near = self.near
        if near is None:
            for i, bits in picked:
                self.sample(bits, counted, first + i)
            return
        if counted:
            near.total += n
        near.refs += len(every)
        found = [near.sample(bits, counted, 0) < len(near.bounds) for bits in every]
        at = dict(picked)
        for j in range(len(every)):
            bucket = UNTRACKED
            if j in at:
                bucket = self.sample(at[j], False, first + j, near.max_keys + 1.0)
            if counted and not found[j]:
                self.count_far(bucket)

    def count_far(self, bucket: int) -> None:
        """A reference the near core did not find: a tracked one counts for the untracked
        ones since the tracked share changed too."""
        self.far_refs += 1
        if bucket < 0:
            return
        self.far_tracked += 1
        w = 1.0 / self.weight * self.far_refs / self.far_tracked
        self.sampled += w
        self.buckets[bucket] += w

    def sample(self, bits: int, counted: bool, when: int, floor: float = 0.0) -> int:
        if bits & LOW_BITS >= self.track:
            return UNTRACKED
        if bits not in self.live and len(self.live) >= self.max_keys \
                and self.track > self.threshold:
            while len(self.live) >= self.max_keys and self.track > self.threshold:
                self.set_track(max(self.track // 2, self.threshold))
                self.live = {b: v for b, v in self.live.items() if b & LOW_BITS < self.track}
                self.times = sorted(t for t, _ in self.live.values())
                self.key_at = {t: b for b, (t, _) in self.live.items()}
            if bits & LOW_BITS >= self.track:
                return UNTRACKED
        now, self.clock = self.clock, self.clock + 1
        distance: float | None = None  # cold
        previous = self.live.get(bits)
        if previous is None:
            if len(self.live) >= self.max_keys:  # forget the least recently used key
                del self.live[self.key_at.pop(self.times.pop(0))]
                self.forgotten += 1
        else:
            time, then = previous
            later = len(self.times) - bisect_right(self.times, time)  # live keys used since
            distance = (later + 1) * self.track_weight
            if self.track_weight > 1:  # no more distinct keys than references since
                distance = min(distance, when - then)
            distance = max(distance, floor)
            self.times.pop(bisect_left(self.times, time))
            del self.key_at[time]
        self.live[bits] = (now, when)
        self.times.append(now)
        self.key_at[now] = bits
        bucket = len(self.bounds) if distance is None else bisect_left(self.bounds, distance)
        if counted:
            self.sampled += self.count_weight
            self.buckets[bucket] += self.count_weight
            if self.keep:
                self.kept.append((float("inf") if distance is None else distance,
                                  self.count_weight))
        return bucket


def oracle_of(profile: object) -> OracleCore:
    """An oracle set up as ``profile`` (a :class:`kvobs.reuse.ReuseProfile`) set up its
    core(s), before any reference."""
    near = getattr(profile, "_near", None)
    core = profile.core  # type: ignore[attr-defined]
    return OracleCore(
        profile.max_keys, profile._threshold, profile._weight,  # type: ignore[attr-defined]
        profile.bounds, core.track,  # type: ignore[attr-defined]
        None if near is None else oracle_of(near),
        profile.keep_samples)  # type: ignore[attr-defined]
