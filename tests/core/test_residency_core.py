"""The residency tracker's C core (``ResidencyCore``, kernels/residency.c) against its
oracle (tests/tracker_oracles.py): the same samples, in the same order, on the same events
and clock; the same bounds; and the engine's calls reach C with no Python frame in
between."""

from __future__ import annotations

import gc
import random
import time
import weakref

import pytest

from kvobs.errors import ConfigError
from kvobs.kernels._ext import native
from kvobs.residency import ResidencyTracker
from kvobs.reuse import ReuseProfile
from tests.tracker_oracles import ResidencyOracle


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


def replay(tracker: ResidencyTracker | ResidencyOracle, seed: int, keys: int = 600,
           events: int = 4000, drain_every: int = 97) -> list[object]:
    """Random keyed events (batches of 0-11 keys, now and then 65-300, with repeats) over
    ``2 * keys`` distinct keys, drained every ``drain_every`` events; what it saw."""
    rnd = random.Random(seed)
    keyspace = [rnd.randbytes(36) for _ in range(keys)] + list(range(-40, keys - 40))
    seen: list[object] = []
    for i in range(events):
        size = rnd.randrange(65, 300) if rnd.random() < 0.05 else rnd.randrange(0, 12)
        batch = rnd.choices(keyspace, k=size)  # a key may come twice in one batch
        shape = rnd.choice((list, tuple, set))
        getattr(tracker, rnd.choice(("born", "born", "reused", "evicted")))(shape(batch))
        if i % drain_every == 0:
            seen.append(tracker.drain())
            seen.append(tracker.tracked)
    seen.append(tracker.drain())
    return seen


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize(("rate", "max_keys", "buffer_limit", "keys", "drain_every"), [
    (1.0, 10_000, 100_000, 600, 97),     # everything sampled, no bound reached
    (1 / 4, 50, 30, 600, 97),            # the key bound forgets, the rings wrap
    (1.0, 10_000, 7, 600, 1000),         # rings of 7 wrap many times between drains
    (1.0, 10_000, 100_000, 6000, 500),   # more than 4,096 keys: the table grows
    (1 / 16, 16384, 65536, 600, 97),     # the defaults
])
def test_the_c_core_takes_the_samples_its_oracle_takes(seed, rate, max_keys, buffer_limit,
                                                        keys, drain_every) -> None:
    c_clock, oracle_clock = SteppingClock(seed), SteppingClock(seed)
    tracker = ResidencyTracker(clock_ns=c_clock, rate=rate, max_keys=max_keys,
                               buffer_limit=buffer_limit)
    oracle = ResidencyOracle(oracle_clock, rate, max_keys, buffer_limit)
    c_seen = replay(tracker, seed, keys, drain_every=drain_every)
    assert c_seen == replay(oracle, seed, keys, drain_every=drain_every)  # values and order,
    assert c_clock.reads == oracle_clock.reads  # wrapped rings included; the clock read once
    assert tracker._core.counts() == (oracle.tracked, oracle.forgotten)  # a call that sampled
    assert any(stays or gaps for stays, gaps in c_seen[::2])  # the replay took samples
    if keys > 4096:
        assert max(c_seen[1::2]) > 4096  # the C table grew past its first size


def test_memory_and_buffers_stay_bounded_in_c() -> None:
    clock = iter(range(0, 10**15, 10**9)).__next__  # one second per call that samples
    tracker = ResidencyTracker(clock_ns=clock, rate=1.0, max_keys=100, buffer_limit=50)
    tracker.born(range(10_000))
    assert tracker.tracked == 100  # the newest 100 births
    assert tracker._core.counts() == (100, 9_900)  # the forgotten ones are counted
    for key in range(9_900, 10_000):
        tracker.evicted([key])
    stays, gaps = tracker.drain()
    assert stays == [float(s) for s in range(51, 101)] and gaps == []  # the newest 50
    assert tracker.tracked == 0 and tracker.drain() == ([], [])


@pytest.mark.parametrize("shape", [list, tuple, set, frozenset, iter])
def test_the_core_samples_the_keys_its_oracle_samples_from_every_collection(shape) -> None:
    """Whatever collection an adapter passes (vLLM: sets of chunk keys), the core picks
    the keys whose ``hash((key,))`` falls under the rate, about 1 in 16."""
    rnd = random.Random(4)
    keys = [rnd.randbytes(36) for _ in range(4000)] + list(range(-50, 4000)) + ["a", "b"]
    clock = iter(range(0, 10**12, 10**9)).__next__
    tracker = ResidencyTracker(clock_ns=clock, rate=1 / 16, max_keys=10**6)
    oracle = ResidencyOracle(clock, 1 / 16, 10**6, 65536)
    tracker.born(shape(keys))
    tracker.evicted(shape(keys))
    oracle.born(shape(keys))
    oracle.evicted(shape(keys))
    sampled = len(oracle.drain()[0])
    assert len(tracker.drain()[0]) == sampled
    assert 0.03 < sampled / len(keys) < 0.10
    picked = set(oracle.sample(keys))
    tracker.born(shape(keys))
    assert tracker.tracked == len(picked)


def test_bounds_are_checked() -> None:
    for bad in ({"max_keys": 0}, {"max_keys": 2**30 + 1}, {"buffer_limit": 0},
                {"buffer_limit": 2**61 + 1}, {"rate": 0.0}, {"rate": 1.5}):
        with pytest.raises(ConfigError, match="residency"):
            ResidencyTracker(**bad)  # type: ignore[arg-type]


def test_the_clock_is_read_only_for_sampled_keys_and_a_failing_one_changes_nothing() -> None:
    clock = SteppingClock(0)
    tracker = ResidencyTracker(clock_ns=clock, rate=1 / 16)
    unsampled = [key for key in range(2000) if hash((key,)) & 0xFFFF >= 4096][:50]
    tracker.born([])
    tracker.born(unsampled)
    tracker.evicted(unsampled)
    assert clock.reads == 0 and tracker.tracked == 0

    def broken() -> int:
        raise RuntimeError("clock down")

    sampled = [key for key in range(2000) if hash((key,)) & 0xFFFF < 4096][:3]
    tracker.clock_ns = broken
    with pytest.raises(RuntimeError, match="clock down"):
        tracker.born(sampled)
    assert tracker.tracked == 0 and tracker.drain() == ([], [])


def test_a_core_whose_clock_holds_its_owner_is_collected() -> None:
    class Simulation:
        def __init__(self) -> None:
            self.now = 0
            self.tracker = ResidencyTracker(clock_ns=self.clock, rate=1.0)

        def clock(self) -> int:
            return self.now

    sim = Simulation()
    sim.tracker.born(["a"])
    gone = weakref.ref(sim)
    del sim
    gc.collect()
    assert gone() is None  # sim -> tracker -> core -> clock -> sim: a cycle the GC sees


def test_a_key_whose_hash_changes_the_list_is_no_crash() -> None:
    keys: list[object] = []

    class Meddling:
        def __hash__(self) -> int:
            keys.clear()  # runs Python code in the middle of the C loop
            return 7

    tracker = ResidencyTracker(rate=1.0)
    profile = ReuseProfile(capacity_blocks=8, rate=1.0)
    for call in (tracker.born, tracker.reused, tracker.evicted,
                 native.ThrashCore(16).offloaded, profile.reference):
        keys[:] = [Meddling(), "b", "c", "d"]
        call(keys)  # sees the list as it is after the hash: no freed memory is read
    with pytest.raises(RuntimeError, match="not initialised"):
        native.ThrashCore.__new__(native.ThrashCore).offloaded(["a"])
    with pytest.raises(RuntimeError, match="not initialised"):
        native.ResidencyCore.__new__(native.ResidencyCore).born(["a"])


def test_the_real_clock_is_read_in_c_and_a_virtual_one_through_python() -> None:
    tracker = ResidencyTracker(rate=1.0)
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


def test_bad_keys_and_clocks_are_clean_errors_in_c() -> None:
    tracker = ResidencyTracker(rate=1.0)
    with pytest.raises(TypeError):
        tracker.born([["unhashable"]])
    with pytest.raises(TypeError):
        tracker.born(42)  # not a collection of keys
    tracker.clock_ns = lambda: "soon"  # type: ignore[assignment, return-value]
    with pytest.raises(TypeError, match="int nanoseconds"):
        tracker.born(["a"])
    tracker.clock_ns = lambda: 2**70  # type: ignore[assignment]
    with pytest.raises(TypeError, match="int nanoseconds"):
        tracker.born(["a"])
    with pytest.raises(TypeError, match="clock must be None"):
        tracker._core.clock = 5
    tracker.clock_ns = time.monotonic_ns
    tracker.born(["a"])  # still works after the errors
    assert tracker.tracked == 1
