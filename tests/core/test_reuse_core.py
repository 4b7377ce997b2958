"""The reuse profile's C core (``ReuseCore``, kernels/reuse.c) against its oracle
(tests/reuse_oracle.py, the core's rules written out plainly): the same counts, step by
step. Both are fed the same lookups and writes and must agree on every counter: total,
sampled and forgotten references, tracked keys, the tracked share and the per-bucket
counts, of the sampled core and of the exact core beside it.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from kvobs.kernels._ext import native
from kvobs.reuse import ReuseProfile
from tests.lru_oracle import exact_lru_event_hit_ratio, mixed_trace, zipf
from tests.reuse_oracle import OracleCore, oracle_of


def feed_both(profile: ReuseProfile, oracle: OracleCore, references: list, seed: int) -> None:
    rnd = random.Random(seed)
    for start in range(0, len(references), 48):
        chunk = references[start:start + 48]
        if rnd.random() < 0.25:
            profile.write(chunk)
            oracle.reference(chunk, False)
        else:
            profile.reference(chunk)
            oracle.reference(chunk, True)


def core_state(core: Any) -> tuple[Any, ...]:
    """Every counter of a core (``ReuseCore`` or its oracle)."""
    return core.stats(), core.counts(), core.track


def assert_agree(profile: ReuseProfile, oracle: OracleCore) -> None:
    """The profile's core, and its exact core where it has one, count as the oracle's."""
    assert core_state(profile.core) == core_state(oracle)
    assert (profile._near is None) == (oracle.near is None)
    if profile._near is not None and oracle.near is not None:
        assert core_state(profile._near.core) == core_state(oracle.near)


@pytest.mark.parametrize(("capacity", "rate", "max_keys", "adaptive"), [
    (2000, None, 1 << 17, True),   # the default: exact (the C arrays grow 4096 -> 16384)
    (3000, 1.0, 10_000, True),     # grown to a max_keys that is no power of two, forgetting
    (8, 1.0, 64, True),            # hundreds of compactions and forgotten keys
    (100, 0.25, 512, True),        # the tracked share halved to the rate, then forgetting
    (100, 0.3, 512, True),         # ... to a rate that is no power of two
    (100, 0.25, 512, False),       # plain SHARDS, bounded
    (50_000, None, 4096, True),    # a low rate
    (50_000, None, 4096, False),
])
def test_the_core_counts_as_its_oracle(capacity, rate, max_keys, adaptive) -> None:
    references = zipf(60_000, 12_000, 0.9, seed=capacity)
    profile = ReuseProfile(capacity, rate=rate, max_keys=max_keys, adaptive=adaptive)
    oracle = oracle_of(profile)
    feed_both(profile, oracle, references, seed=1)
    assert_agree(profile, oracle)
    assert profile.sampled > 0
    assert (profile._near is None) == (profile.rate == 1)


def test_bytes_keys_sample_alike_and_a_bad_key_is_a_clean_error() -> None:
    keys = [random.Random(2).randbytes(32) for _ in range(3000)]
    rnd = random.Random(3)
    profile = ReuseProfile(64, rate=0.5)
    oracle = oracle_of(profile)
    for _ in range(3000):
        request = [keys[rnd.randrange(len(keys))] for _ in range(6)]
        profile.reference(request)
        oracle.reference(request)
    assert_agree(profile, oracle)
    for core in (profile, oracle):  # a key fails: none of the call's references is recorded
        with pytest.raises(TypeError):
            core.reference([keys[0], ["unhashable"]])
    for _ in range(300):            # (its total is), in either: they go on agreeing
        request = [keys[rnd.randrange(len(keys))] for _ in range(6)]
        profile.reference(request)
        oracle.reference(request)
    assert_agree(profile, oracle)


def test_kept_samples_are_every_counted_distance() -> None:
    """``keep_samples`` (kvobs whatif's replay): every counted distance kept exactly, the
    hits at any size read from them; sampled too, where the share halves."""
    references = zipf(20_000, 6_000, 0.9, seed=4)
    for settings in ({"rate": 1.0, "max_keys": 512}, {"rate": 1 / 8, "max_keys": 512}):
        profile = ReuseProfile(100, keep_samples=True, **settings)
        oracle = oracle_of(profile)
        assert oracle.keep and oracle.near is None
        feed_both(profile, oracle, references, seed=2)
        assert_agree(profile, oracle)
        for size in (1, 2.5, 37, 100, 511, 4000, float("inf")):
            assert profile.core.hits(size) == oracle.hits(size), (settings, size)
    with pytest.raises(ValueError, match="keeps its samples"):
        ReuseProfile(100).core.hits(10)


def test_c_core_is_exact_against_the_lru_oracle_with_writes() -> None:
    events = mixed_trace(40_000, seed=5)
    profile = ReuseProfile(1000)  # rate 1: exact at every bound
    assert profile.rate == 1.0
    for key, counted in events:
        (profile.reference if counted else profile.write)([key])
    for bound in profile.bounds:
        assert profile.hit_ratio(bound) == pytest.approx(
            exact_lru_event_hit_ratio(events, bound), abs=1e-12)


def test_written_then_reference_is_a_write_then_a_reference() -> None:
    """The recorder's one call per keyed lookup (the blocks written since, then the
    prompt) counts as the two calls it replaces, and empties the written list."""
    references = zipf(20_000, 4_000, 0.9, seed=7)
    one_call = ReuseProfile(500, rate=0.5)
    two_calls = ReuseProfile(500, rate=0.5)
    rnd = random.Random(8)
    for start in range(0, len(references), 40):
        cut = start + rnd.randrange(0, 40)
        written, keys = references[start:cut], references[cut:start + 40]
        pending = list(written)
        one_call.written_then_reference(pending, keys)
        assert pending == []
        two_calls.write(written)
        two_calls.reference(keys)
    assert one_call._stats() == two_calls._stats() and one_call.counts() == two_calls.counts()


def test_written_then_reference_errors_are_clean_and_the_list_is_emptied() -> None:
    profile = ReuseProfile(64, rate=1.0)
    pending: list = [b"a", ["unhashable"], b"b"]
    with pytest.raises(TypeError, match="unhashable"):
        profile.written_then_reference(pending, [b"c"])
    assert pending == [] and profile.references == 0  # the lookup after it never counted
    with pytest.raises(TypeError, match="written must be a list"):
        profile.written_then_reference((b"a",), [b"c"])
    with pytest.raises(TypeError, match="takes 2, 5 or 6 arguments"):
        profile.written_then_reference([])


class _Shrinking:
    """A key whose first hash empties the rest of the list it is recorded in."""

    def __init__(self, value: int, keys: list) -> None:
        self.value, self.keys, self.armed = value, keys, True

    def __hash__(self) -> int:
        if self.armed:
            self.armed = False
            del self.keys[1:]
        return hash(self.value)


@pytest.mark.parametrize("shrink", [True, False])
def test_a_list_changed_by_a_key_s_hash_is_read_alike(shrink: bool) -> None:
    """The core reads a call's keys live, at most its length, as its oracle does: the same
    keys and the same reference numbers, so the capped distances after it agree too."""
    profile = ReuseProfile(4, rate=0.5, max_keys=64)
    oracle = oracle_of(profile)
    for core in (profile, oracle):
        core.reference(list(range(30)))
        keys: list = [None, *range(1000, 1040)]
        keys[0] = _Shrinking(-1, keys) if shrink else -1
        core.reference(keys)
        core.reference(list(range(30)))
    assert_agree(profile, oracle)
    assert profile.total == 30 + 41 + 30  # the call's length, as it began


def test_the_core_s_settings_are_range_checked() -> None:
    """Out-of-range settings are clear errors, never wrapped or silently wrong; a core
    whose tracked share can fall below 1 keeps the reference numbers its scaled distances
    are capped by, whatever its weight says."""
    core = native.ReuseCore
    for args, message in (((4, 2**64 + 200, 2.0, [1.0]), "int too big|OverflowError"),
                          ((4, -1, 2.0, [1.0]), "negative|OverflowError"),
                          ((4, 2**24 + 1, 1.0, [1.0]), r"threshold must be in \[1, 2\*\*24\]"),
                          ((4, 0, 1.0, [1.0]), r"threshold must be in"),
                          ((4, 100, 2.0, [1.0], 99), r"track must be in \[threshold"),
                          ((4, 100, 2.0, [1.0], 2**64 + 200), "int too big|OverflowError"),
                          ((4, 100, 0.0, [1.0]), "weight must be a finite number >= 1"),
                          ((4, 100, float("nan"), [1.0]), "weight must be"),
                          ((4, 100, float("inf"), [1.0]), "weight must be")):
        with pytest.raises((ValueError, OverflowError), match=message):
            core(*args)
    odd = core(4, 100, 1.0, [1.0, 2.0], 1 << 24)  # weight 1, yet a share that halves
    for start in range(200):
        odd.reference(list(range(start, start + 10)))
    assert odd.stats()[3] <= 4 and 100 <= odd.track < 1 << 24  # halved: distances scaled


def test_a_core_that_was_never_initialised_raises_instead_of_crashing() -> None:
    core = native.ReuseCore.__new__(native.ReuseCore)
    for call in (core.counts, core.stats, lambda: core.reference([1, 2]),
                 lambda: core.written_then_reference([3], [1, 2])):
        with pytest.raises(RuntimeError, match="ReuseCore is not initialised"):
            call()


def test_python_run_by_a_key_or_a_bound_cannot_reset_the_core_under_a_call() -> None:
    """A key's ``__hash__`` re-initialising the core that reads it (its buffers are sized
    by the settings it started with), and a bound's ``__float__`` using the core while
    ``__init__`` reads the bounds: clear errors, never a crash or a hang."""
    core = native.ReuseCore(64, 1 << 24, 1.0, [1.0, 2.0])

    class Resets:
        def __hash__(self) -> int:
            core.__init__(64, 1 << 23, 2.0, [1.0, 2.0])
            return 1

    with pytest.raises(RuntimeError, match="while a call reads its keys"):
        core.reference([Resets(), *range(100)])
    core.reference([1, 1])  # the core is whole: the first call stopped at its first key
    assert core.counts() == [1.0, 0.0, 1.0]

    class Uses:
        def __float__(self) -> float:
            core.reference(list(range(5000)))
            return 8.0

    core.__init__(64, 1 << 24, 1.0, [1.0, Uses()])  # the bounds are read before any reset
    assert core.counts() == [0.0, 0.0, 0.0] and core.stats() == (0, 0.0, 0, 0)
    core.reference([7, 7])
    assert core.counts() == [1.0, 0.0, 1.0]


def test_a_near_core_is_fed_every_key_and_must_be_exact() -> None:
    """``near``: a second core tracking every key (threshold and track 2**24, weight 1)
    fed every key of every call from the same hash, written keys too; anything else, a
    chain of near cores, or resetting a core another one holds, is a clear error."""
    near = native.ReuseCore(64, 1 << 24, 1.0, [1.0, 2.0])
    core = native.ReuseCore(64, 1 << 20, 16.0, [1.0, 2.0], None, near)
    assert core.near is near
    core.written_then_reference([7], [1, 2, 1, 7])
    assert near.stats() == (4, 4.0, 0, 3)  # 4 counted references, 3 keys tracked
    assert near.counts() == [0.0, 1.0, 3.0]  # 1 at distance 2; 7 written: distance 3
    plain = native.ReuseCore(64, 1 << 20, 16.0, [1.0])
    for near_arg, message in ((plain, "near must track every key"),
                              ([1], "near must be a ReuseCore"),
                              (native.ReuseCore.__new__(native.ReuseCore),
                               "near is not initialised"),
                              (native.ReuseCore(64, 1 << 24, 1.0, [1.0], None,
                                                native.ReuseCore(64, 1 << 24, 1.0, [1.0])),
                               "near has a near core of its own")):
        with pytest.raises(ValueError, match=message):
            native.ReuseCore(64, 1 << 20, 16.0, [1.0], None, near_arg)
    with pytest.raises(ValueError, match="near must be another ReuseCore"):
        plain.__init__(64, 1 << 24, 1.0, [1.0], None, plain)
    with pytest.raises(RuntimeError, match="holds as its near core"):
        near.__init__(64, 1 << 20, 16.0, [1.0])
    del core  # let go: the near core may be reset again
    near.__init__(64, 1 << 20, 16.0, [1.0])
