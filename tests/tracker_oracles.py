"""The thrash and residency trackers' C cores (``ThrashCore``, ``ResidencyCore``) written
out plainly with ordered dicts: the oracles their tests hold them to.

Both cores hash a call's keys first (an unhashable key changes nothing) and tell keys apart
by that hash; at most their bound of keys is kept, the oldest forgotten first.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable, Hashable, Iterable

from kvobs.snapshot import ThrashSnapshot


class ThrashOracle:
    """``ThrashCore(max_blocks, window_ns)``: key -> offload time * 2 + reused, in offload
    order."""

    def __init__(self, max_blocks: int, window_ns: int) -> None:
        self.max_blocks, self.window_ns = max_blocks, window_ns
        self.blocks: OrderedDict[int, int] = OrderedDict()
        self.in_window = self.reused = self.evicted_unused = self.untracked = 0

    def offloaded(self, keys: Iterable[Hashable], now: int) -> None:
        for h in [hash(key) for key in keys]:
            self.blocks[h] = now * 2
            self.blocks.move_to_end(h)
            if len(self.blocks) > self.max_blocks:
                self.blocks.popitem(last=False)
                self.untracked += 1

    def onloaded(self, keys: Iterable[Hashable], now: int) -> None:
        for h in [hash(key) for key in keys]:
            entry = self.blocks.get(h)
            if entry is None:
                continue
            if now - (entry >> 1) <= self.window_ns:
                self.in_window += 1
            if not entry & 1:
                self.blocks[h] = entry | 1
                self.reused += 1

    def evicted(self, keys: Iterable[Hashable]) -> None:
        for h in [hash(key) for key in keys]:
            entry = self.blocks.pop(h, None)
            if entry is not None and not entry & 1:
                self.evicted_unused += 1

    def snapshot(self) -> ThrashSnapshot:
        return ThrashSnapshot(self.in_window, self.reused, self.evicted_unused,
                              len(self.blocks), self.untracked)


class ResidencyOracle:
    """``ResidencyCore``: the keys whose ``hash((key,))`` samples, each with its birth and
    last use, in birth order; the clock read once per call that sampled a key."""

    def __init__(self, clock: Callable[[], int], rate: float, max_keys: int,
                 buffer_limit: int) -> None:
        self.clock, self.max_keys = clock, max_keys
        self.threshold = max(1, round(rate * (1 << 16)))
        self.blocks: OrderedDict[int, list[int]] = OrderedDict()  # bits -> [born, used]
        self.stays: deque[float] = deque(maxlen=buffer_limit)
        self.gaps: deque[float] = deque(maxlen=buffer_limit)
        self.forgotten = 0

    def sample(self, keys: Iterable[Hashable]) -> list[int]:
        return [bits for key in keys if (bits := hash((key,))) & 0xFFFF < self.threshold]

    def born(self, keys: Iterable[Hashable]) -> None:
        picked = self.sample(keys)
        if picked:
            now = self.clock()
            for bits in picked:
                if bits not in self.blocks and len(self.blocks) == self.max_keys:
                    self.blocks.popitem(last=False)
                    self.forgotten += 1
                self.blocks[bits] = [now, now]
                self.blocks.move_to_end(bits)

    def reused(self, keys: Iterable[Hashable]) -> None:
        picked = self.sample(keys)
        if picked:
            now = self.clock()
            for bits in picked:
                entry = self.blocks.get(bits)
                if entry is not None:
                    self.gaps.append((now - entry[1]) / 1e9)
                    entry[1] = now

    def evicted(self, keys: Iterable[Hashable]) -> None:
        picked = self.sample(keys)
        if picked:
            now = self.clock()
            for bits in picked:
                entry = self.blocks.pop(bits, None)
                if entry is not None:
                    self.stays.append((now - entry[0]) / 1e9)

    def drain(self) -> tuple[list[float], list[float]]:
        taken = list(self.stays), list(self.gaps)
        self.stays.clear()
        self.gaps.clear()
        return taken

    @property
    def tracked(self) -> int:
        return len(self.blocks)
