"""The tier and link event counters in C (``TierCore`` / ``LinkCore``, the bases of
``TierRecorder`` / ``LinkRecorder`` where the extension is built) against their Python
twins (``PyTierCore`` / ``PyLinkCore``): the same counts, the same keyed calls into the
thrash and residency trackers in the same order, the same errors, on random event
histories called every way an adapter calls them (by position, by keyword, defaults)."""

from __future__ import annotations

import gc
import random
from collections import deque
from collections.abc import Callable
from typing import Any

import pytest

from kvobs.catalog import EVICTION_REASONS
from kvobs.kernels._ext import native
from kvobs.recorder import LinkRecorder, PyLinkCore, PyTierCore, Recorder, TierRecorder

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
    """A C tier core and a Python one, alike, with their trackers' call logs."""
    pair = []
    logs: list[list[Any]] = []
    for cls in (native.TierCore, PyTierCore):  # type: ignore[union-attr]
        tier = cls()
        for field in ("allocations", "frees_to_cache", "frees_to_free", "reuses", "stores",
                      "evictions_capacity"):
            setattr(tier, field, 0)
        tier.evictions = dict.fromkeys(EVICTION_REASONS, 0)
        log: list[Any] = []
        tier.thrash = CallLog(log, fail_on)
        tier.residency = CallLog(log, fail_on)
        pair.append(tier)
        logs.append(log)
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
            with pytest.raises(RuntimeError) if _feeds(method, fail_on) else _nothing():
                getattr(tier, method)(3, keys=[1, 2])
    assert tier_state(c_tier) == tier_state(py_tier)
    assert c_log == py_log


def _feeds(method: str, tracker_method: str) -> bool:
    return tracker_method in {"allocate": ("born",), "reuse": ("onloaded", "reused"),
                              "store": ("offloaded", "born"),
                              "evict": ("evicted",)}[method]


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


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
    pair = []
    for cls in (native.LinkCore, PyLinkCore):  # type: ignore[union-attr]
        link = cls()
        for field in ("operations", "blocks", "bytes", "failures", "drops", "dropped_samples"):
            setattr(link, field, 0)
        link.seconds = 0.0
        link.buffer_limit = buffer_limit
        link.durations = deque()
        pair.append(link)
    return pair[0], pair[1]


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
