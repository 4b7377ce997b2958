"""Thrash signals: re-onloads inside the window, reuse, wasted offloads; bounded memory.

A random history checks that the C core (``ThrashCore``, kernels/thrash.c) counts as its
oracle (tests/tracker_oracles.py) does, entry for entry.
"""

import random

import pytest

from kvobs.errors import ConfigError
from kvobs.thrash import ThrashTracker
from tests.tracker_oracles import ThrashOracle


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


@pytest.mark.parametrize("seed", range(6))
def test_the_c_core_counts_as_its_oracle(seed):
    """A random history of batches (re-offloads, onloads inside and outside the window,
    evictions of tracked and unknown keys, the bound reached and the core's arrays grown
    past their first size): the tracker and the oracle report the same counts after every
    call."""
    rnd = random.Random(seed)
    clock = Clock()
    max_blocks = rnd.choice([7, 300, 5000])
    tracker = ThrashTracker(window_s=2.0, max_blocks=max_blocks, clock_ns=clock)
    oracle = ThrashOracle(max_blocks, tracker.window_ns)
    space = max_blocks * 2
    as_key = rnd.choice([int, lambda k: f"chunk-{k}".encode()])
    for _ in range(3000):
        clock.advance(rnd.random() * 0.5)
        keys = [as_key(rnd.randrange(space)) for _ in range(rnd.randrange(1, 12))]
        op = rnd.choice(["offloaded", "offloaded", "onloaded", "evicted"])
        if rnd.random() < 0.3:
            keys = iter(keys) if rnd.random() < 0.5 else set(keys)
            keys = list(keys)
        getattr(tracker, op)(keys)
        if op == "evicted":
            oracle.evicted(keys)
        else:
            getattr(oracle, op)(keys, clock())
        assert tracker.snapshot() == oracle.snapshot(), op
    assert tracker.snapshot().tracked_blocks <= max_blocks


def test_the_c_core_takes_any_iterable_and_refuses_unhashable_keys_whole():
    tracker = ThrashTracker()
    tracker.offloaded(k for k in (b"a", b"b"))
    tracker.onloaded({b"a"})
    with pytest.raises(TypeError):
        tracker.evicted([b"a", ["unhashable"]])
    snap = tracker.snapshot()
    assert (snap.tracked_blocks, snap.offloaded_reused, snap.offloaded_evicted_unused) == (2, 1, 0)


def test_a_simulation_clock_set_after_construction_is_used():
    """The demo swaps in its virtual clock after the recorder built the tracker (the C
    core's own real clock must then not be used: five virtual seconds are out of the
    window, however little real time passed)."""
    tracker = ThrashTracker(window_s=1.0)
    clock = Clock()
    tracker.clock_ns = clock
    tracker.offloaded(["a"])
    clock.advance(0.5)
    tracker.onloaded(["a"])
    tracker.offloaded(["b"])
    clock.advance(5.0)
    tracker.onloaded(["b"])
    snap = tracker.snapshot()
    assert (snap.onloads_in_window, snap.offloaded_reused) == (1, 2)


def test_a_virtual_clock_before_zero_is_honoured():
    """A simulation's times may be negative: they are times all the same, never a sign to
    read the real clock."""
    tracker = ThrashTracker(window_s=1.0)
    clock = Clock()
    clock.now_ns = -10 * 10**9
    tracker.clock_ns = clock
    tracker.offloaded(["a"])
    clock.advance(5.0)
    tracker.onloaded(["a"])  # 5 virtual seconds later: out of the window
    snap = tracker.snapshot()
    assert (snap.onloads_in_window, snap.offloaded_reused) == (0, 1)


def test_with_the_real_clock_the_engine_calls_the_core_directly():
    """No Python frame per event: the tracker's methods are the C core's, which stamps
    with CLOCK_MONOTONIC and the tracker's window."""
    tracker = ThrashTracker(window_s=10.0)
    assert tracker.offloaded == tracker._core.offloaded
    tracker.offloaded([b"a"])
    tracker.onloaded([b"a"])
    tracker.offloaded([b"b"])
    tracker.evicted([b"b"])
    snap = tracker.snapshot()
    assert (snap.onloads_in_window, snap.offloaded_reused, snap.offloaded_evicted_unused) == \
        (1, 1, 1)
    instant = ThrashTracker(window_s=1e-9)  # one nanosecond: no onload is that quick
    instant.offloaded([b"a"])
    instant.onloaded([b"a"])
    assert (instant.snapshot().onloads_in_window, instant.snapshot().offloaded_reused) == (0, 1)
