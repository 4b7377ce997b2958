"""The tier and link event counters (``TierCore`` / ``LinkCore``, the bases of
``TierRecorder`` / ``LinkRecorder``) on random event histories, called every way an
adapter calls them (by position, by keyword, defaults), against a tally of the events
written from :data:`kvobs.events.MEANINGS`: which counter each one moves, and which calls
its keys make into the thrash and residency trackers, in order."""

from __future__ import annotations

import gc
import random
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import pytest

from kvobs.catalog import EVICTION_REASONS
from kvobs.recorder import LinkRecorder, Recorder, TierRecorder


class CallLog:
    """A thrash or residency tracker that writes down every call (and may fail one)."""

    def __init__(self, log: list[tuple[str, tuple[Any, ...]]], fail_on: str = "") -> None:
        self.log = log
        self.fail_on = fail_on

    def __getattr__(self, method: str) -> Callable[[Any], None]:
        def call(keys: Any) -> None:
            self.log.append((method, tuple(keys)))
            if method == self.fail_on:
                raise RuntimeError(f"{method} failed")
        return call


def logged_tier(fail_on: str = "") -> tuple[TierRecorder, list[Any]]:
    """A tier whose thrash and residency trackers are one call log."""
    log: list[Any] = []
    tracker: Any = CallLog(log, fail_on)
    return TierRecorder("gpu", 8, 16, 1, thrash=tracker, residency=tracker), log


def tier_state(tier: Any) -> tuple[Any, ...]:
    return (tier.allocations, tier.frees_to_cache, tier.frees_to_free, tier.reuses,
            tier.stores, tier.evictions_capacity, dict(tier.evictions))


#: Each tier event's parameters and defaults (kvobs.events.TierEvents, with keys).
PARAMS: dict[str, tuple[tuple[str, Any], ...]] = {
    "allocate": (("n", 1), ("keys", None)),
    "free": (("n", 1), ("cached", False)),
    "reuse": (("n", 1), ("keys", None)),
    "store": (("n", 1), ("keys", None)),
    "evict": (("n", 1), ("reason", "capacity"), ("keys", None)),
}
#: The counter each keyed event adds to, and the tracker calls its keys make, in order.
KEYED = {"allocate": ("allocations", ("born",)),
         "reuse": ("reuses", ("onloaded", "reused")),
         "store": ("stores", ("offloaded", "born"))}


def tally(calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]]) -> tuple[Any, list[Any]]:
    """The counters and the tracker calls the events ``calls`` make."""
    counts = dict.fromkeys(("allocations", "frees_to_cache", "frees_to_free", "reuses",
                            "stores", "evictions_capacity"), 0)
    evictions = dict.fromkeys(EVICTION_REASONS, 0)
    log: list[Any] = []
    for method, args, kwargs in calls:
        given = dict(PARAMS[method])
        given.update(zip((name for name, _ in PARAMS[method]), args, strict=False))
        given.update(kwargs)
        n, keys = given["n"], given.get("keys")
        if method == "free":
            counts["frees_to_cache" if given["cached"] else "frees_to_free"] += n
        elif method == "evict":
            log += [] if keys is None else [("evicted", tuple(keys))] * 2
            reason = given["reason"]
            if reason == "capacity":
                counts["evictions_capacity"] += n
            else:
                evictions[reason if reason in evictions else "other"] += n
        else:
            counter, tracker_calls = KEYED[method]
            counts[counter] += n
            log += [] if keys is None else [(call, tuple(keys)) for call in tracker_calls]
    return (*counts.values(), evictions), log


def random_tier_call(rnd: random.Random) -> tuple[str, tuple[Any, ...], dict[str, Any]]:
    """One event as some adapter calls it: by position, by keyword, or with defaults."""
    method = rnd.choice(("allocate", "free", "reuse", "store", "evict"))
    n = rnd.randrange(0, 40)
    keys: Any = rnd.choice((None, [], [rnd.randrange(100) for _ in range(rnd.randrange(1, 6))],
                            (b"k1", b"k2")))
    second = {"free": ("cached", rnd.choice((True, False, 0, 1, None))),
              "evict": ("reason", rnd.choice(("capacity", "explicit", "reset", "other",
                                               "unheard-of")))}.get(method, ("keys", keys))
    shape = rnd.randrange(5)
    if shape == 0:
        return method, (), {}
    if shape == 1:
        return method, (n,), {}
    if shape == 2:
        return method, (n, second[1]), {}
    if shape == 3:
        return method, (), {"n": n, second[0]: second[1]}
    kwargs = {second[0]: second[1]}
    if method == "evict":
        kwargs["keys"] = keys
    return method, (n,), kwargs


@pytest.mark.parametrize("seed", range(4))
def test_a_tier_counts_every_event_as_the_tally_says(seed: int) -> None:
    tier, log = logged_tier()
    rnd = random.Random(seed)
    calls = [random_tier_call(rnd) for _ in range(3000)]
    for method, args, kwargs in calls:
        getattr(tier, method)(*args, **kwargs)
    state, expected_log = tally(calls)
    assert tier_state(tier) == state
    assert log == expected_log
    assert len(log) > 500  # keyed calls happened, in the same order
    assert tier.evictions["other"] > 0 and tier.evictions_capacity > 0


@pytest.mark.parametrize("fail_on", ["born", "reused", "onloaded", "offloaded", "evicted"])
def test_a_failing_tracker_raises_after_the_count_moved(fail_on: str) -> None:
    """A tracker that raises reaches the adapter's reader (which counts the error; the
    engine goes on): allocate / reuse / store have counted by then, evict has not (its
    keys go to the trackers first)."""
    tier, log = logged_tier(fail_on)
    calls = []
    for method in ("allocate", "reuse", "store", "evict"):
        feeds = fail_on in {"allocate": ("born",), "reuse": ("onloaded", "reused"),
                            "store": ("offloaded", "born"), "evict": ("evicted",)}[method]
        with pytest.raises(RuntimeError) if feeds else nullcontext():
            getattr(tier, method)(3, keys=[1, 2])
        if not (feeds and method == "evict"):
            calls.append((method, (3,), {"keys": [1, 2]}))
    state, _ = tally(calls)
    assert tier_state(tier) == state
    assert ("evicted", (1, 2)) in log  # the failing call was made


@pytest.mark.parametrize(("call", "message"), [
    (lambda t: t.free("3"), "str"),
    (lambda t: t.allocate(1, None, 3), "positional argument"),
    (lambda t: t.store(1, blocks=[1]), "unexpected keyword argument 'blocks'"),
    (lambda t: t.reuse(1, n=2), "multiple values for argument 'n'"),
])
def test_bad_calls_raise_a_clear_error_and_count_nothing(call: Any, message: str) -> None:
    tier, _ = logged_tier()
    before = tier_state(tier)
    with pytest.raises(TypeError, match=message):
        call(tier)
    assert tier_state(tier) == before


def test_a_recorder_tier_s_methods_can_be_replaced(monkeypatch: pytest.MonkeyPatch) -> None:
    tier = Recorder().add_tier("host", capacity_blocks=8, block_tokens=16, block_bytes=1)
    seen: list[int] = []
    monkeypatch.setattr(TierRecorder, "store", lambda self, n=1, keys=None: seen.append(n))
    tier.store(5)
    assert seen == [5] and tier.stores == 0


def test_a_tier_in_a_reference_cycle_is_collected() -> None:
    """A residency tracker whose clock holds the tier (a simulation's does) is no leak."""
    collected: list[bool] = []

    class Holder:
        def __init__(self, tier: TierRecorder) -> None:
            self.tier = tier

        def __del__(self) -> None:
            collected.append(True)

    tier = TierRecorder("host", 8, 16, 1)
    tier.residency = Holder(tier)  # type: ignore[assignment]
    del tier
    gc.collect()
    assert collected == [True]


def link_state(link: Any) -> tuple[Any, ...]:
    return (link.operations, link.blocks, link.bytes, link.failures, link.drops,
            link.dropped_samples, round(link.seconds, 9), list(link.durations))


@pytest.mark.parametrize("seed", range(3))
def test_a_link_counts_every_event_as_the_tally_says(seed: int) -> None:
    rnd = random.Random(seed)
    buffer_limit = rnd.choice((5, 50, 65536))
    link = LinkRecorder("gpu", "host", buffer_limit=buffer_limit)
    ops = blocks_in = bytes_in = failures = drops = 0
    seconds_in, durations = 0.0, []
    for _ in range(2000):
        blocks, nbytes, seconds = rnd.randrange(9), rnd.randrange(1 << 20), rnd.random() / 100
        method, args, kwargs = rnd.choice((
            ("transfer", (blocks, nbytes), {}),
            ("transfer", (blocks, nbytes, seconds), {}),
            ("transfer", (blocks, nbytes, None), {}),
            ("transfer", (blocks,), {"nbytes": nbytes, "seconds": seconds}),
            ("completed", (blocks, nbytes, seconds), {}),
            ("timed", (seconds,), {}),
            ("sample", (seconds,), {}),
            ("add_seconds", (seconds,), {}),
            ("add_bytes", (nbytes,), {}),
            ("fail", (blocks,), {}),
            ("fail", (blocks, nbytes), {}),
            ("failed", (), {"blocks": blocks, "nbytes": nbytes}),
            ("drop", (blocks,), {}),
        ))
        getattr(link, method)(*args, **kwargs)
        timed = method in ("completed", "timed", "sample") or (
            method == "transfer" and ((len(args) == 3 and args[2] is not None) or kwargs))
        if method in ("transfer", "completed"):
            ops, blocks_in, bytes_in = ops + 1, blocks_in + blocks, bytes_in + nbytes
        elif method == "add_bytes":
            bytes_in += nbytes
        elif method in ("fail", "failed"):
            failures += blocks
        elif method == "drop":
            drops += blocks
        if (timed and method != "sample") or method == "add_seconds":
            seconds_in += seconds
        if timed:
            durations.append(seconds)
    kept = durations[:buffer_limit]
    assert link_state(link) == (ops, blocks_in, bytes_in, failures, drops,
                                len(durations) - len(kept), round(seconds_in, 9), kept)
    assert link.operations > 0 and link.durations


def test_link_drops_samples_beyond_its_buffer_and_keeps_counting() -> None:
    link = LinkRecorder("gpu", "host", buffer_limit=3)
    for i in range(5):
        link.transfer(2, 100, 0.5 + i)
    assert (link.operations, link.blocks, link.bytes, link.seconds) == (5, 10, 500, 12.5)
    assert link.drain_durations() == [0.5, 1.5, 2.5] and link.dropped_samples == 2
    with pytest.raises(TypeError, match="nbytes"):
        link.transfer(1)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        link.timed("fast")  # type: ignore[arg-type]
    assert link.operations == 5


def test_the_link_methods_take_keywords() -> None:
    link = LinkRecorder("gpu", "host")
    link.drop(blocks=2)
    link.timed(seconds=0.5)
    link.sample(seconds=0.25)
    link.add_seconds(seconds=1.0)
    link.add_bytes(nbytes=4096)
    assert (link.drops, link.seconds, list(link.durations)) == (2, 1.5, [0.5, 0.25])
    assert (link.operations, link.bytes) == (0, 4096)  # bytes apart from the transfers
    with pytest.raises(TypeError, match="seconds"):
        link.completed(1, 2)  # type: ignore[call-arg]


def test_written_blocks_that_arrive_during_the_call_wait_for_the_next_lookup() -> None:
    """A key's ``__hash__`` (or another thread meanwhile) may write more blocks while a
    lookup hands the written ones over: those wait."""
    from kvobs.reuse import ReuseProfile

    written: list[Any] = []

    class Writing:
        def __init__(self, value: int) -> None:
            self.value = value

        def __hash__(self) -> int:
            if self.value < 3:
                written.append(1000 + self.value)
            return self.value

    profile = ReuseProfile(1000, rate=1.0)
    written[:] = [Writing(i) for i in range(5)]
    profile.written_then_reference(written, [1])
    assert written == [1000, 1001, 1002]
