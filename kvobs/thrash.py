"""Does the host pool pay for itself? Per-block bookkeeping of offloads and onloads.

For each block offloaded to the host tier the tracker remembers when it left the GPU
and whether it was ever onloaded again. From that it counts:

* thrash onloads: blocks onloaded back within ``window_s`` of their offload (the GPU
  tier is too small for the working set: blocks bounce over PCIe);
* reused offloads: offloaded blocks onloaded at least once (the offload paid off);
* wasted offloads: offloaded blocks evicted from the host before any reuse.

Memory is bounded: at most ``max_blocks`` entries; the oldest are forgotten first and
counted as untracked (``kvobs_thrash_untracked_blocks_total``), so a dashboard can tell
when the classification covers only part of the offloads. Calls take a batch of keys
(one per transfer), not one block.

The bookkeeping runs in C (``ThrashCore``, kernels/thrash.c: one call per batch, about 50
bytes per tracked block, keys told apart by their 64-bit hash; with the default clock,
which the core reads itself, a tracker's methods are the core's own).

Example:
    >>> tracker = ThrashTracker(window_s=10.0, max_blocks=4)
    >>> tracker.offloaded(["a", "b"]); tracker.onloaded(["a"]); tracker.evicted(["b"])
    >>> s = tracker.snapshot()
    >>> s.onloads_in_window, s.offloaded_reused, s.offloaded_evicted_unused
    (1, 1, 1)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Iterable

from kvobs.errors import ConfigError
from kvobs.kernels._ext import native
from kvobs.snapshot import ThrashSnapshot


class ThrashTracker:
    """Bounded offload/onload history keyed by block key (hash, chunk key...)."""

    def __init__(
        self,
        window_s: float = 10.0,
        max_blocks: int = 1 << 18,
        clock_ns: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        if not window_s > 0:
            raise ConfigError(f"thrash window must be > 0 seconds, got {window_s!r}")
        if max_blocks <= 0:
            raise ConfigError(f"thrash max_blocks must be > 0, got {max_blocks!r}")
        self.window_ns = int(window_s * 1e9)
        self.max_blocks = max_blocks
        self._core = native.ThrashCore(max_blocks, self.window_ns)
        #: ``evicted(keys)``: blocks ``keys`` were dropped from the host tier (the core's own
        #: method: no clock involved, the engine's calls go straight to C)
        self.evicted: Callable[[Iterable[Hashable]], None] = self._core.evicted
        self.clock_ns = clock_ns  # a simulation may set its virtual clock later

    @property
    def clock_ns(self) -> Callable[[], int]:
        """The clock offloads and onloads are stamped with (a simulation sets its own)."""
        return self._clock_ns

    @clock_ns.setter
    def clock_ns(self, clock: Callable[[], int]) -> None:
        self._clock_ns = clock
        if clock is time.monotonic_ns:
            # The core reads this clock itself: the engine's calls go straight to C, with
            # no Python frame per event. Any other clock goes through the methods below.
            self.offloaded = self._core.offloaded  # type: ignore[method-assign]
            self.onloaded = self._core.onloaded  # type: ignore[method-assign]
        else:
            for name in ("offloaded", "onloaded"):
                self.__dict__.pop(name, None)

    def offloaded(self, keys: Iterable[Hashable]) -> None:
        """Blocks ``keys`` were copied from the GPU into the host tier (with the default
        clock, the core's own method stands in for this one, as for :meth:`onloaded`)."""
        self._core.offloaded(keys, self._clock_ns())

    def onloaded(self, keys: Iterable[Hashable]) -> None:
        """Blocks ``keys`` were copied from the host tier back to the GPU."""
        self._core.onloaded(keys, self._clock_ns(), self.window_ns)

    def snapshot(self) -> ThrashSnapshot:
        """Current counts."""
        return ThrashSnapshot(*self._core.counts())
