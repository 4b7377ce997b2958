"""Thrash signals: re-onloads inside the window, reuse, wasted offloads; bounded memory."""

import pytest

from kvobs.errors import ConfigError
from kvobs.thrash import ThrashTracker


class Clock:
    def __init__(self):
        self.now_ns = 0

    def advance(self, seconds):
        self.now_ns += int(seconds * 1e9)

    def __call__(self):
        return self.now_ns


def test_window_reuse_and_waste():
    clock = Clock()
    tracker = ThrashTracker(window_s=5.0, clock_ns=clock)
    tracker.offloaded(["a", "b", "c"])
    clock.advance(2)
    tracker.onloaded(["a"])  # inside the window: thrash
    clock.advance(10)
    tracker.onloaded(["b", "a"])  # b: late reuse, not thrash; a: reused already, thrash? no, late
    tracker.evicted(["a", "b", "c"])  # c never reused: wasted
    tracker.onloaded(["zzz"])  # unknown keys are ignored
    snap = tracker.snapshot()
    assert snap.onloads_in_window == 1
    assert snap.offloaded_reused == 2
    assert snap.offloaded_evicted_unused == 1
    assert snap.tracked_blocks == 0


def test_memory_is_bounded():
    tracker = ThrashTracker(max_blocks=100)
    tracker.offloaded(range(1000))
    snap = tracker.snapshot()
    assert snap.tracked_blocks == 100 and snap.untracked_blocks == 900


def test_reoffload_restarts_the_window():
    clock = Clock()
    tracker = ThrashTracker(window_s=1.0, clock_ns=clock)
    tracker.offloaded(["a"])
    clock.advance(5)
    tracker.offloaded(["a"])
    clock.advance(0.5)
    tracker.onloaded(["a"])
    assert tracker.snapshot().onloads_in_window == 1


def test_bad_settings():
    with pytest.raises(ConfigError, match="window"):
        ThrashTracker(window_s=0)
    with pytest.raises(ConfigError, match="max_blocks"):
        ThrashTracker(max_blocks=0)
