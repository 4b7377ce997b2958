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

The bookkeeping runs in the C extension where it was built (``ThrashCore``: one call per
batch, about 50 bytes per tracked block, keys told apart by their 64-bit hash; with the
default clock, which the core reads itself, a tracker's methods are the core's own); the pure
Python path (an ordered dict, about 150 bytes per block plus the key; keys told apart by
equality) is the fallback, and tests hold the two to the same counts.

Example:
    >>> tracker = ThrashTracker(window_s=10.0, max_blocks=4)
    >>> tracker.offloaded(["a", "b"]); tracker.onloaded(["a"]); tracker.evicted(["b"])
    >>> s = tracker.snapshot()
    >>> s.onloads_in_window, s.offloaded_reused, s.offloaded_evicted_unused
    (1, 1, 1)
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable
from typing import Any

from kvobs.errors import ConfigError
from kvobs.kernels._ext import native
from kvobs.snapshot import ThrashSnapshot

_Core: Any = getattr(native, "ThrashCore", None)  # the C core, or None


class ThrashTracker:
    """Bounded offload/onload history keyed by block key (hash, chunk key...).

    ``native``: use the C core (default: where it was built); ``False`` forces the pure
    Python path.
    """

    def __init__(
        self,
        window_s: float = 10.0,
        max_blocks: int = 1 << 18,
        clock_ns: Callable[[], int] = time.monotonic_ns,
        native: bool | None = None,
    ) -> None:
        if not window_s > 0:
            raise ConfigError(f"thrash window must be > 0 seconds, got {window_s!r}")
        if max_blocks <= 0:
            raise ConfigError(f"thrash max_blocks must be > 0, got {max_blocks!r}")
        self.window_ns = int(window_s * 1e9)
        self.max_blocks = max_blocks
        use_native = _Core is not None if native is None else bool(native) and _Core is not None
        self._core = _Core(max_blocks, self.window_ns) if use_native else None
        if self._core is not None:  # no clock involved: the engine's calls go straight to C
            self.evicted = self._core.evicted  # type: ignore[method-assign]
        self.clock_ns = clock_ns  # a simulation may set its virtual clock later
        # the pure-Python state (unused with the C core): key -> offload time ns * 2 +
        # reused (one int, not a list: a third of the memory); insertion order = offload
        # order.
        self._blocks: OrderedDict[Hashable, int] = OrderedDict()
        self._lock = threading.Lock()
        self.onloads_in_window = 0
        self.offloaded_reused = 0
        self.offloaded_evicted_unused = 0
        self.untracked_blocks = 0

    @property
    def clock_ns(self) -> Callable[[], int]:
        """The clock offloads and onloads are stamped with (a simulation sets its own)."""
        return self._clock_ns

    @clock_ns.setter
    def clock_ns(self, clock: Callable[[], int]) -> None:
        self._clock_ns = clock
        if self._core is not None and clock is time.monotonic_ns:
            # The core reads this clock itself: the engine's calls go straight to C, with
            # no Python frame per event. Any other clock goes through the methods below.
            self.offloaded = self._core.offloaded  # type: ignore[method-assign]
            self.onloaded = self._core.onloaded  # type: ignore[method-assign]
        else:
            for name in ("offloaded", "onloaded"):
                self.__dict__.pop(name, None)

    @property
    def native(self) -> bool:
        """Whether the C core keeps the bookkeeping."""
        return self._core is not None

    def offloaded(self, keys: Iterable[Hashable]) -> None:
        """Blocks ``keys`` were copied from the GPU into the host tier."""
        now = self._clock_ns()
        if self._core is not None:
            self._core.offloaded(keys, now)
            return
        with self._lock:
            blocks = self._blocks
            stamp = now * 2
            for key in keys:  # the oldest goes as each new key comes, as in the C core
                blocks[key] = stamp
                blocks.move_to_end(key)
                if len(blocks) > self.max_blocks:
                    blocks.popitem(last=False)
                    self.untracked_blocks += 1

    def onloaded(self, keys: Iterable[Hashable]) -> None:
        """Blocks ``keys`` were copied from the host tier back to the GPU."""
        now = self._clock_ns()
        if self._core is not None:
            self._core.onloaded(keys, now, self.window_ns)
            return
        with self._lock:
            blocks = self._blocks
            for key in keys:
                entry = blocks.get(key)
                if entry is None:
                    continue
                if now - (entry >> 1) <= self.window_ns:
                    self.onloads_in_window += 1
                if not entry & 1:
                    blocks[key] = entry | 1
                    self.offloaded_reused += 1

    def evicted(self, keys: Iterable[Hashable]) -> None:
        """Blocks ``keys`` were dropped from the host tier (with the C core, the core's own
        method stands in for this one)."""
        with self._lock:
            for key in keys:
                entry = self._blocks.pop(key, None)
                if entry is not None and not entry & 1:
                    self.offloaded_evicted_unused += 1

    def snapshot(self) -> ThrashSnapshot:
        """Current counts."""
        if self._core is not None:
            return ThrashSnapshot(*self._core.counts())
        return ThrashSnapshot(
            self.onloads_in_window,
            self.offloaded_reused,
            self.offloaded_evicted_unused,
            len(self._blocks),
            self.untracked_blocks,
        )
