"""The tier and link event counters in C (``TierCore`` / ``LinkCore``, the bases of
``TierRecorder`` / ``LinkRecorder`` where the extension is built) against their Python
twins (``PyTierCore`` / ``PyLinkCore``): the same counts, the same keyed calls into the
thrash and residency trackers in the same order, the same errors, on random event
histories called every way an adapter calls them (by position, by keyword, defaults)."""

from __future__ import annotations

import gc
import random
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import pytest

from kvobs.kernels._ext import native
from kvobs.recorder import (
    LinkRecorder,
    PyTierCore,
    Recorder,
    TierRecorder,
    on_python_counters,
)

native_only = pytest.mark.skipif(native is None, reason="the C extension is not built here")


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


def tier_pair(fail_on: str = "") -> tuple[Any, Any, list[Any], list[Any]]:
    """A tier on the C counters and one on the Python ones, alike, with their trackers'
    call logs."""
    pair = []
    logs: list[list[Any]] = []
    for cls in (TierRecorder, on_python_counters(TierRecorder)):
        log: list[Any] = []
        tracker: Any = CallLog(log, fail_on)  # stands for both trackers
        pair.append(cls("gpu", 8, 16, 1, thrash=tracker, residency=tracker))
        logs.append(log)
    assert isinstance(pair[0], native.TierCore)  # type: ignore[union-attr]
    assert isinstance(pair[1], PyTierCore)
    return pair[0], pair[1], logs[0], logs[1]


def tier_state(tier: Any) -> tuple[Any, ...]:
    return (tier.allocations, tier.frees_to_cache, tier.frees_to_free, tier.reuses,
            tier.stores, tier.evictions_capacity, dict(tier.evictions))


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


@native_only
@pytest.mark.parametrize("seed", range(4))
def test_tier_core_counts_as_its_python_twin(seed: int) -> None:
    c_tier, py_tier, c_log, py_log = tier_pair()
    rnd = random.Random(seed)
    for _ in range(3000):
        method, args, kwargs = random_tier_call(rnd)
        getattr(c_tier, method)(*args, **kwargs)
        getattr(py_tier, method)(*args, **kwargs)
    assert tier_state(c_tier) == tier_state(py_tier)
    assert c_log == py_log
    assert len(c_log) > 500  # keyed calls happened, in the same order
    assert c_tier.evictions["other"] > 0 and c_tier.evictions_capacity > 0


@native_only
@pytest.mark.parametrize("fail_on", ["born", "reused", "onloaded", "offloaded", "evicted"])
def test_a_failing_tracker_leaves_the_same_counts(fail_on: str) -> None:
    """The C counts move, or not, exactly where the Python ones do before a tracker
    raises (the adapter's reader then counts the error; the engine goes on)."""
    c_tier, py_tier, c_log, py_log = tier_pair(fail_on)
    for method in ("allocate", "reuse", "store", "evict"):
        for tier in (c_tier, py_tier):
            with pytest.raises(RuntimeError) if _feeds(method, fail_on) else nullcontext():
                getattr(tier, method)(3, keys=[1, 2])
    assert tier_state(c_tier) == tier_state(py_tier)
    assert c_log == py_log


def _feeds(method: str, tracker_method: str) -> bool:
    return tracker_method in {"allocate": ("born",), "reuse": ("onloaded", "reused"),
                              "store": ("offloaded", "born"),
                              "evict": ("evicted",)}[method]


@native_only
@pytest.mark.parametrize(("call", "message"), [
    (lambda t: t.allocate(1.5), "integer"),
    (lambda t: t.free("3"), "integer"),
    (lambda t: t.evict(2.0, "explicit"), "integer"),
    (lambda t: t.allocate(1, None, 3), "at most 2 arguments"),
    (lambda t: t.store(1, blocks=[1]), "unexpected keyword argument 'blocks'"),
    (lambda t: t.reuse(1, n=2), "multiple values for argument 'n'"),
])
def test_bad_calls_raise_a_clear_error_and_count_nothing(call: Any, message: str) -> None:
    c_tier, _, _, _ = tier_pair()
    before = tier_state(c_tier)
    with pytest.raises(TypeError, match=message):
        call(c_tier)
    assert tier_state(c_tier) == before


@native_only
def test_the_recorder_tier_is_the_c_core_and_its_methods_can_be_replaced(
        monkeypatch: pytest.MonkeyPatch) -> None:
    tier = Recorder().add_tier("host", capacity_blocks=8, block_tokens=16, block_bytes=1)
    assert isinstance(tier, native.TierCore)  # type: ignore[union-attr]
    seen: list[int] = []
    monkeypatch.setattr(TierRecorder, "store", lambda self, n=1, keys=None: seen.append(n))
    tier.store(5)
    assert seen == [5] and tier.stores == 0


@native_only
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


def link_pair(buffer_limit: int) -> tuple[Any, Any]:
    """A link on the C counters and one on the Python ones, alike."""
    return (LinkRecorder("gpu", "host", buffer_limit=buffer_limit),
            on_python_counters(LinkRecorder)("gpu", "host", buffer_limit=buffer_limit))


def link_state(link: Any) -> tuple[Any, ...]:
    return (link.operations, link.blocks, link.bytes, link.failures, link.drops,
            link.dropped_samples, round(link.seconds, 9), list(link.durations))


@native_only
@pytest.mark.parametrize("seed", range(3))
def test_link_core_counts_as_its_python_twin(seed: int) -> None:
    rnd = random.Random(seed)
    c_link, py_link = link_pair(buffer_limit=rnd.choice((5, 50, 65536)))
    for _ in range(2000):
        blocks, nbytes, seconds = rnd.randrange(9), rnd.randrange(1 << 20), rnd.random() / 100
        call = rnd.choice((
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
        for link in (c_link, py_link):
            getattr(link, call[0])(*call[1], **call[2])
    assert link_state(c_link) == link_state(py_link)
    assert c_link.operations > 0 and c_link.durations


@native_only
def test_link_drops_samples_beyond_its_buffer_and_keeps_counting() -> None:
    link = LinkRecorder("gpu", "host", buffer_limit=3)
    assert isinstance(link, native.LinkCore)  # type: ignore[union-attr]
    for i in range(5):
        link.transfer(2, 100, 0.5 + i)
    assert (link.operations, link.blocks, link.bytes, link.seconds) == (5, 10, 500, 12.5)
    assert link.drain_durations() == [0.5, 1.5, 2.5] and link.dropped_samples == 2
    with pytest.raises(TypeError, match="missing required argument 'nbytes'"):
        link.transfer(1)
    with pytest.raises(TypeError):
        link.timed("fast")
    assert link.operations == 5


# -- the review's cases: Python code run from inside a C event method ------------------------

@native_only
@pytest.mark.parametrize("meddle", ["replace", "reset-held", "delete", "none"])
def test_evict_survives_a_reason_or_count_that_changes_the_tier(meddle: str) -> None:
    """A reason's ``__hash__`` or a count's ``__index__`` runs Python code in the middle of
    ``evict``; whatever it does to ``tier.evictions``, the call reads only what it holds."""
    tier = TierRecorder("gpu", 8, 16, 1)
    tier.evictions["explicit"] = 10**12 + 7  # an int object of its own, not a cached one

    class Count:
        def __index__(self) -> int:
            if meddle == "replace":
                tier.evictions = {"explicit": 0, "other": 0}
            elif meddle == "reset-held":
                tier.evictions["explicit"] = 0
                _ = [10**12 + i for i in range(100)]  # would reuse the freed int's memory
            elif meddle == "delete":
                del tier.evictions
            else:
                tier.evictions = None  # type: ignore[assignment]
            return 1

    if meddle in ("delete", "none"):  # the count is read first: then no dict is left
        with pytest.raises((AttributeError, TypeError), match="evictions"):
            tier.evict(Count(), "explicit")
    else:
        tier.evict(Count(), "explicit")
        assert tier.evictions["explicit"] == 1  # counted in the dict that is there now


@native_only
def test_evict_survives_a_reason_whose_hash_replaces_the_dict() -> None:
    tier = TierRecorder("gpu", 8, 16, 1)

    class Reason:
        def __hash__(self) -> int:
            tier.evictions = {"other": 0}
            return 12345

        def __eq__(self, other: object) -> bool:
            return False

    tier.evictions = {str(i): 0 for i in range(50)} | {"other": 0}
    tier.evict(2, Reason())  # counted as other in the dict the call began with
    assert tier.evictions == {"other": 0}


@native_only
def test_a_tracker_dropped_while_its_method_runs_stays_alive_for_the_call() -> None:
    tier = TierRecorder("gpu", 8, 16, 1)

    class Owner(list):
        born = list.extend  # a C method that runs the generator below

    tier.residency = Owner()  # type: ignore[assignment]

    def keys():  # type: ignore[no-untyped-def]
        tier.residency = None
        _ = [object() for _ in range(1000)]
        yield from range(10_000)

    tier.allocate(1, keys())
    assert tier.allocations == 1 and tier.residency is None


@native_only
def test_a_link_whose_buffer_is_deleted_by_its_own_len_fails_cleanly() -> None:
    link = LinkRecorder("gpu", "host")

    class Buffer(list):
        def __len__(self) -> int:
            del link.durations
            return 0

    link.durations = Buffer()  # type: ignore[assignment]
    link.sample(0.5)  # appended to the buffer the call held
    with pytest.raises(AttributeError, match="durations"):
        link.sample(0.5)


@native_only
@pytest.mark.parametrize(("field", "value"), [
    ("allocations", 1.5), ("reuses", 2**64), ("stores", None)])
def test_a_failed_counter_assignment_leaves_the_counter(field: str, value: Any) -> None:
    tier = TierRecorder("gpu", 8, 16, 1)
    tier.allocate(3)
    tier.reuse(3)
    tier.store(3)
    with pytest.raises((TypeError, OverflowError)):
        setattr(tier, field, value)
    assert getattr(tier, field) == 3
    with pytest.raises(TypeError, match="cannot be deleted"):
        delattr(tier, field)
    link = LinkRecorder("gpu", "host", buffer_limit=4)
    with pytest.raises((TypeError, OverflowError)):
        link.buffer_limit = float("inf")  # type: ignore[assignment]
    assert link.buffer_limit == 4


@native_only
def test_counters_refuse_to_wrap_past_64_bits() -> None:
    tier = TierRecorder("gpu", 8, 16, 1)
    tier.allocations = 2**63 - 2
    tier.allocate()
    with pytest.raises(OverflowError, match="64 bits"):
        tier.allocate()
    assert tier.allocations == 2**63 - 1
    link = LinkRecorder("gpu", "host")
    link.bytes = 2**63 - 1
    with pytest.raises(OverflowError):
        link.transfer(1, 1)
    assert (link.operations, link.blocks) == (0, 0)  # all or nothing


@native_only
def test_the_c_methods_take_keywords_and_show_their_signatures() -> None:
    import inspect

    link = LinkRecorder("gpu", "host")
    link.drop(blocks=2)
    link.timed(seconds=0.5)
    link.sample(seconds=0.25)
    link.add_seconds(seconds=1.0)
    link.add_bytes(nbytes=4096)
    assert (link.drops, link.seconds, list(link.durations)) == (2, 1.5, [0.5, 0.25])
    assert (link.operations, link.bytes) == (0, 4096)  # bytes apart from the transfers
    with pytest.raises(TypeError, match="missing required argument 'seconds'"):
        link.completed(1, 2)
    transfer = inspect.signature(LinkRecorder.transfer)
    evict = inspect.signature(TierRecorder.evict)
    assert str(transfer) == "(self, /, blocks, nbytes, seconds=None)"
    assert str(evict) == "(self, /, n=1, reason='capacity', keys=None)"


@pytest.mark.parametrize("native_core", [True, False])
def test_written_blocks_that_arrive_during_the_call_wait_for_the_next_lookup(
        native_core: bool) -> None:
    """A key's ``__hash__`` (or another thread meanwhile) may write more blocks while a
    lookup hands the written ones over: those wait, on both paths."""
    from kvobs.reuse import ReuseProfile

    if native_core and native is None:
        pytest.skip("the C extension is not built here")
    written: list[Any] = []

    class Writing:
        def __init__(self, value: int) -> None:
            self.value = value

        def __hash__(self) -> int:
            if self.value < 3:
                written.append(1000 + self.value)
            return self.value

    profile = ReuseProfile(1000, rate=1.0, native=native_core)
    written[:] = [Writing(i) for i in range(5)]
    profile.written_then_reference(written, [1])
    assert written == [1000, 1001, 1002]
