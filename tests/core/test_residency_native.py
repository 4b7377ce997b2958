"""The residency tracker's C core (``ResidencyCore``) against its pure-Python path: the same
samples, in the same order, on the same events and clock; the same bounds; and the engine's
calls reach C with no Python frame in between."""

from __future__ import annotations

import random
import time

import pytest

from kvobs.residency import ResidencyTracker

native_only = pytest.mark.skipif(not ResidencyTracker().native,
                                 reason="the C extension is not built here")


class SteppingClock:
    """A virtual clock that moves on each read, by a seeded random amount (ns)."""

    def __init__(self, seed: int) -> None:
        self.rnd = random.Random(seed)
        self.now = -5 * 10**9  # a simulation's clock may start below zero
        self.reads = 0

    def __call__(self) -> int:
        self.reads += 1
        self.now += self.rnd.randrange(1, 3 * 10**9)
        return self.now


def replay(tracker: ResidencyTracker, seed: int, events: int = 4000) -> list[object]:
    """Random keyed events over a small key space, drained now and then; what it saw."""
    rnd = random.Random(seed)
    keyspace = [rnd.randbytes(36) for _ in range(600)] + list(range(-40, 600))
    seen: list[object] = []
    for i in range(events):
        keys = rnd.sample(keyspace, rnd.randrange(0, 12))
        shape = rnd.choice((list, tuple, set))
        getattr(tracker, rnd.choice(("born", "born", "reused", "evicted")))(shape(keys))
        if i % 97 == 0:
            seen.append(tracker.drain())
            seen.append(tracker.tracked)
    seen.append(tracker.drain())
    return seen


@native_only
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize(("rate", "max_keys", "buffer_limit"),
                         [(1.0, 10_000, 100_000), (1 / 4, 50, 30), (1 / 16, 16384, 65536)])
def test_the_c_core_takes_the_samples_the_python_path_takes(seed, rate, max_keys,
                                                            buffer_limit) -> None:
    pair = []
    for native in (True, False):
        clock = SteppingClock(seed)
        tracker = ResidencyTracker(clock_ns=clock, rate=rate, max_keys=max_keys,
                                   buffer_limit=buffer_limit, native=native)
        assert tracker.native is native
        pair.append((replay(tracker, seed), clock.reads))
    (c_seen, c_reads), (py_seen, py_reads) = pair
    assert c_seen == py_seen
    assert c_reads == py_reads  # the clock is read once per call that sampled a key
    assert any(stays or gaps for stays, gaps in c_seen[::2])  # the replay took samples


@native_only
def test_memory_and_buffers_stay_bounded_in_c() -> None:
    tracker = ResidencyTracker(rate=1.0, max_keys=100, buffer_limit=50, native=True)
    tracker.born(range(10_000))
    assert tracker.tracked == 100  # the newest 100 births
    tracker.evicted(range(10_000))
    stays, gaps = tracker.drain()
    assert len(stays) == 50 and gaps == []  # the ring keeps the newest 50
    assert tracker.tracked == 0 and tracker.drain() == ([], [])


@native_only
def test_the_real_clock_is_read_in_c_and_a_virtual_one_through_python() -> None:
    tracker = ResidencyTracker(rate=1.0, native=True)
    core = tracker._core
    assert tracker.born == core.born and tracker.evicted == core.evicted  # no Python frame
    assert core.clock is None  # CLOCK_MONOTONIC, time.monotonic_ns's clock
    before = time.monotonic_ns()
    tracker.born(["a"])
    tracker.evicted(["a"])
    (stay,), _ = tracker.drain()
    assert 0 <= stay <= (time.monotonic_ns() - before) / 1e9
    tracker.clock_ns = iter(range(0, 10**12, 10**9)).__next__  # a simulation's, set later
    tracker.born(["b"])
    tracker.reused(["b"])
    tracker.evicted(["b"])
    assert tracker.drain() == ([2.0], [1.0])
    tracker.clock_ns = time.monotonic_ns
    assert core.clock is None


@native_only
def test_bad_keys_and_clocks_are_clean_errors_in_c() -> None:
    tracker = ResidencyTracker(rate=1.0, native=True)
    with pytest.raises(TypeError):
        tracker.born([["unhashable"]])
    with pytest.raises(TypeError):
        tracker.born(42)  # not a collection of keys
    tracker.clock_ns = lambda: "soon"  # type: ignore[assignment, return-value]
    with pytest.raises(TypeError):
        tracker.born(["a"])
    with pytest.raises(TypeError, match="clock must be None"):
        tracker._core.clock = 5
    tracker.clock_ns = time.monotonic_ns
    tracker.born(["a"])  # still works after the errors
    assert tracker.tracked == 1
