"""How long blocks stay in a tier, and how long they wait between reuses.

Fed by the keyed events of :mod:`kvobs.events` (a block is *born* in a tier when it is
allocated or stored there with its key, *reused* on a hit, and leaves on eviction), for
every tier whose adapter passes keys: the host tier of vLLM, LMCache, SGLang and the
reference pool, the reference pool's GPU tier. Blocks are sampled by a hash of their key
(1 in 16 by default) so the cost per keyed event stays a hash and a compare; at most
``max_keys`` sampled blocks are remembered (the oldest are forgotten first). Durations
wait in bounded buffers that the telemetry sink drains at collection into
``kvobs_block_residency_seconds{tier}`` and ``kvobs_block_reuse_gap_seconds{tier}``.

Example:
    >>> clock = iter(range(0, 100 * 10**9, 10**9)).__next__   # one second per event
    >>> tracker = ResidencyTracker(clock_ns=clock, rate=1.0)
    >>> tracker.born(["a"]); tracker.reused(["a"]); tracker.evicted(["a"])
    >>> tracker.drain()
    ([2.0], [1.0])
"""

from __future__ import annotations

import functools
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable, Iterable

from kvobs.kernels._ext import native

_SPACE = 1 << 16
_MASK = _SPACE - 1


def _python_sample_bits(threshold: int, mask: int, keys: Iterable[Hashable]) -> list[int]:
    """``hash((key,))`` of the keys whose low bits fall under ``threshold`` (the sampling
    line; the C extension's ``sample_bits`` gives the same values)."""
    return [bits for key in keys if (bits := hash((key,))) & mask < threshold]


#: The C extension's sampler (the same values as the Python line, one call per event,
#: any collection: vLLM passes sets of chunk keys), else the Python line.
_sample_bits = getattr(native, "sample_bits", None)
_pick: Callable[[int, int, Iterable[Hashable]], list[int]] = _sample_bits or _python_sample_bits


class ResidencyTracker:
    """Sampled birth and last-use times of one tier's blocks, by key.

    ``sample(keys)`` gives the sampled keys' bits (with the extension, a C call and no
    Python frame: most keyed events sample nothing); a recorder on a hot path calls it
    and then ``born_bits`` / ``reused_bits`` / ``evicted_bits`` only when it picked some,
    which is what ``born`` / ``reused`` / ``evicted`` do.
    """

    def __init__(self, clock_ns: Callable[[], int] = time.monotonic_ns, rate: float = 1 / 16,
                 max_keys: int = 16384, buffer_limit: int = 65536) -> None:
        self.clock_ns = clock_ns
        self._threshold = max(1, round(rate * _SPACE))
        #: keys -> the sampled ones' bits (a partial over the sampler: no Python frame)
        self.sample: Callable[[Iterable[Hashable]], list[int]] = functools.partial(
            _pick, self._threshold, _MASK)
        self.max_keys = max_keys
        self._blocks: OrderedDict[int, list[int]] = OrderedDict()  # key bits -> [born, used]
        self._residency: deque[float] = deque(maxlen=buffer_limit)
        self._gaps: deque[float] = deque(maxlen=buffer_limit)
        self._lock = threading.Lock()

    def born(self, keys: Iterable[Hashable]) -> None:
        """Blocks ``keys`` now hold data in this tier."""
        picked = self.sample(keys)  # one call per keyed event
        if picked:
            self.born_bits(picked)

    def reused(self, keys: Iterable[Hashable]) -> None:
        """Blocks ``keys`` were hit: the gap since their last use is one sample."""
        picked = self.sample(keys)
        if picked:
            self.reused_bits(picked)

    def evicted(self, keys: Iterable[Hashable]) -> None:
        """Blocks ``keys`` left the tier: their time in it is one sample."""
        picked = self.sample(keys)
        if picked:
            self.evicted_bits(picked)

    def born_bits(self, picked: list[int]) -> None:
        """:meth:`born` of keys already sampled (``picked = sample(keys)``)."""
        now = self.clock_ns()
        with self._lock:
            blocks = self._blocks
            for bits in picked:
                blocks[bits] = [now, now]
                blocks.move_to_end(bits)
            while len(blocks) > self.max_keys:
                blocks.popitem(last=False)

    def reused_bits(self, picked: list[int]) -> None:
        """:meth:`reused` of keys already sampled."""
        now = self.clock_ns()
        with self._lock:
            for bits in picked:
                entry = self._blocks.get(bits)
                if entry is not None:
                    self._gaps.append((now - entry[1]) / 1e9)
                    entry[1] = now

    def evicted_bits(self, picked: list[int]) -> None:
        """:meth:`evicted` of keys already sampled."""
        now = self.clock_ns()
        with self._lock:
            for bits in picked:
                entry = self._blocks.pop(bits, None)
                if entry is not None:
                    self._residency.append((now - entry[0]) / 1e9)

    def drain(self) -> tuple[list[float], list[float]]:
        """Take the buffered ``(residency seconds, reuse gap seconds)`` samples."""
        with self._lock:
            residency, gaps = list(self._residency), list(self._gaps)
            self._residency.clear()
            self._gaps.clear()
        return residency, gaps
