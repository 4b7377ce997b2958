"""The reuse-distance profile against an exact LRU simulation: exact while the blocks in
use fit in its memory bound, sampled (SHARDS) beyond it."""

from __future__ import annotations

import itertools
import tracemalloc

import pytest

from kvobs.errors import ConfigError
from kvobs.reuse import ReuseProfile, default_rate
from tests.lru_oracle import (
    chat_prefixes,
    exact_lru_hit_ratio,
    loop,
    loop_with_hot_set,
    scan_with_hot_set,
    zipf,
)

CAPACITY = 24_000  # blocks; the default rate for it is 1/4 (sampled; no bound at the loop)


def profile_of(references, capacity=CAPACITY, **kwargs) -> ReuseProfile:
    profile = ReuseProfile(capacity, **kwargs)
    for start in range(0, len(references), 64):  # requests of 64 blocks
        profile.reference(references[start:start + 64])
    return profile


WORKLOADS = {
    "zipf-0.9": lambda: zipf(150_000, 20_000, 0.9, seed=1),
    "zipf-1.2": lambda: zipf(150_000, 50_000, 1.2, seed=2),
    "loop-5000": lambda: loop(120_000, 5000),
    "scan+hot": lambda: scan_with_hot_set(120_000, 1500, seed=3),
    "chat": lambda: list(itertools.chain.from_iterable(chat_prefixes(6000, seed=4))),
}


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_default_profile_is_exact_until_max_keys_distinct_blocks(name):
    """At a capacity whose rate is 1/4 the profile still tracks every block until max_keys
    distinct blocks were seen: each reference counts a quarter of a sample, and every bound
    is exact."""
    references = WORKLOADS[name]()
    profile = profile_of(references)
    assert profile.rate == default_rate(CAPACITY) == 1 / 4
    assert profile.tracking_rate == 1.0 and profile.forgotten == 0
    assert profile.sampled == len(references) * profile.rate
    for size in profile.bounds:
        assert profile.hit_ratio(size) == pytest.approx(
            exact_lru_hit_ratio(references, size), abs=1e-12), (name, size)


@pytest.mark.parametrize("adaptive", [True, False], ids=["tracked-share-halved", "plain"])
@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_a_sampled_profile_is_within_0_02_of_exact_lru_at_every_bucket(name, adaptive):
    """Sampled: plain SHARDS at the rate throughout, or a memory bound the blocks in use
    outgrow (16,384 keys: the rate is 1/32 and the tracked share halves to 1/2 or 1/4)."""
    references = WORKLOADS[name]()
    assert len(references) >= 100_000
    settings = {"max_keys": 16_384} if adaptive else {"adaptive": False}
    profile = profile_of(references, **settings)
    distinct = len(set(references))
    assert profile.tracking_rate == (1.0 if adaptive and distinct < 16_384 else
                                     0.5 if adaptive and distinct < 32_768 else
                                     0.25 if adaptive else profile.rate), distinct
    for size in profile.bounds:
        exact = exact_lru_hit_ratio(references, size)
        assert profile.hit_ratio(size) == pytest.approx(exact, abs=0.02), (name, size)


def test_a_loop_with_a_hot_set_at_a_bound_is_exact_for_every_salt():
    """4,960 loop blocks and a hot set of 40: 5,000 distinct blocks between a loop block's
    uses, exactly a bucket bound, so LRU of that size hits every loop reuse and the bound
    below none. Sampled at the rate (1/2), a salt's sample puts every such distance on one
    side of the bound (0.62 off for some salts); tracked whole while it fits, it is exact."""
    capacity = 10_000
    assert default_rate(capacity) == 0.5 and 5000 in ReuseProfile(capacity).bounds
    references = loop_with_hot_set(60_000, 4960, 40, seed=7)
    exact = {size: exact_lru_hit_ratio(references, size) for size in (2500, 5000)}
    assert exact[5000] - exact[2500] > 0.5
    for salt in range(6):
        profile = profile_of([(salt, key) for key in references], capacity=capacity)
        for size, ratio in exact.items():
            assert profile.hit_ratio(size) == pytest.approx(ratio, abs=1e-12), (salt, size)


def aged(profile: ReuseProfile, salt: int) -> ReuseProfile:
    """``profile`` after twice ``max_keys / rate`` distinct blocks were written once, as a
    long-running engine's has seen (older than any reference to come: the exact LRU
    answer of what follows is unchanged), so its tracked share is down to the rate."""
    blocks = int(2 * profile.max_keys / profile.rate)
    for start in range(0, blocks, 4096):
        profile.write([("aged", salt, i) for i in range(start, min(start + 4096, blocks))])
    assert profile.tracking_rate == profile.rate < 1 and profile.forgotten > 0
    return profile


def test_an_aged_profile_is_exact_up_to_its_exact_keys_for_every_salt():
    """The loop with a hot set at the 5,000-block bound again, on a profile that has aged
    to its sampling rate: sampled alone it is 0.62 off for two salts of six (no sample can
    put every distance that equals a bound on its side); the exact LRU stack of the
    ``exact_keys`` most recent blocks beside the sample answers every bound up to it
    exactly (at the defaults: 131,072 blocks at rate 1/2)."""
    capacity = 10_000
    references = loop_with_hot_set(60_000, 4960, 40, seed=7)
    for salt in range(6):
        profile = aged(ReuseProfile(capacity), salt)
        assert profile.exact_keys == profile.max_keys
        for start in range(0, len(references), 64):
            profile.reference([(salt, key) for key in references[start:start + 64]])
        exact_bounds = [b for b in profile.bounds if b <= profile.exact_keys]
        assert len(exact_bounds) == 13
        for size in exact_bounds:
            assert profile.hit_ratio(size) == pytest.approx(
                exact_lru_hit_ratio(references, size), abs=1e-12), (salt, size)


def test_without_the_exact_stack_an_aged_profile_misses_the_loop_at_its_bound():
    """What the exact stack is for: the same aged profile with ``exact_keys=0`` (the
    sample alone) is far off at the loop's bound for some salt."""
    references = loop_with_hot_set(60_000, 4960, 40, seed=7)
    exact = exact_lru_hit_ratio(references, 5000)
    errors = []
    for salt in range(6):
        profile = aged(ReuseProfile(10_000, exact_keys=0), salt)
        for start in range(0, len(references), 64):
            profile.reference([(salt, key) for key in references[start:start + 64]])
        errors.append(abs(profile.hit_ratio(5000) - exact))
    assert max(errors) > 0.3


def test_buckets_beyond_the_exact_stack_never_go_backwards():
    """Beyond ``exact_keys`` the buckets add the sample's counts to the exact count below,
    capped by every reference: each cumulative bucket (an exported ``le`` counter) only
    grows, call after call, and the last is every reference at the rate."""
    profile = ReuseProfile(50_000, max_keys=512)  # exact up to 512 blocks
    assert profile.exact_keys == 512 and profile.rate < 1
    references = zipf(40_000, 30_000, 0.7, seed=11)
    before = [0.0] * (len(profile.bounds) + 1)
    for start in range(0, len(references), 50):
        profile.reference(references[start:start + 50])
        rows = [count for _, count in profile.cumulative()]
        assert all(now >= then for now, then in zip(rows, before, strict=True))
        assert rows == sorted(rows) and rows[-1] == pytest.approx(profile.total * profile.rate)
        before = rows
    assert before[-2] < before[-1]  # some references beyond every bound (or cold)


def test_the_tracked_share_halves_down_to_the_rate_as_max_keys_fills():
    """Distinct blocks past max_keys halve the tracked share (the blocks above the new
    threshold are dropped, none forgotten) down to the rate; only then are the least
    recently used blocks forgotten. Counts stay in samples at the rate throughout."""
    profile = ReuseProfile(64, rate=1 / 8, max_keys=512)
    shares, sampled = [], 0.0
    for start in range(0, 40_000, 100):
        profile.reference(range(start, start + 100))
        assert profile.tracked <= 512 and profile.sampled >= sampled
        sampled = profile.sampled
        shares.append(profile.tracking_rate)
        if profile.tracking_rate > profile.rate:
            assert profile.forgotten == 0
    assert shares == sorted(shares, reverse=True) and set(shares) == {1.0, 0.5, 0.25, 0.125}
    assert profile.forgotten > 0 and profile.counts()[:-1] == [0.0] * len(profile.bounds)
    # every reference cold: the counted total estimates 40,000 references at rate 1/8
    assert profile.sampled == pytest.approx(40_000 / 8, rel=0.1)


@pytest.mark.parametrize("loop_blocks", [5000, 2500])
def test_a_loop_of_exactly_a_bucket_bound_is_exact_at_a_sampled_rate(loop_blocks):
    """A cyclic scan whose length is a bucket bound: LRU of that size hits every reuse,
    one block smaller none. The sampled estimate of a distance that equals the bound lands
    on either side of it, whichever blocks are sampled; the references since the block's
    previous use bound the distance, so the profile is exact there for every salt (plain
    SHARDS at the rate: the default tracks every block of the loop)."""
    capacity = 10_000                          # rate 1/2; bounds include 2,500 and 5,000
    assert default_rate(capacity) == 0.5 and loop_blocks in ReuseProfile(capacity).bounds
    references = loop(12 * loop_blocks, loop_blocks)
    exact = exact_lru_hit_ratio(references, loop_blocks)
    assert exact == pytest.approx(11 / 12)
    for salt in range(6):
        salted = [(salt, key) for key in references]
        profile = profile_of(salted, capacity=capacity, adaptive=False)
        assert profile.hit_ratio(loop_blocks) == pytest.approx(exact, abs=0.02), salt


def test_kept_samples_answer_any_size_and_rate_one_is_exact():
    references = zipf(30_000, 5000, 1.0, seed=5)
    exact_profile = profile_of(references, rate=1.0, keep_samples=True)
    for size in (37, 555, 1234, 4999):
        assert exact_profile.hit_ratio(size) == pytest.approx(
            exact_lru_hit_ratio(references, size), abs=1e-12)


def test_cumulative_buckets_end_with_every_reference_and_cold_misses_in_inf():
    profile = profile_of(loop(40_000, 100), rate=1.0)
    rows = profile.cumulative()
    assert rows[-1] == (float("inf"), 40_000)
    assert rows[-2][1] == 40_000 - 100  # all but the first pass hit at >= 100 blocks
    assert [count for _, count in rows] == sorted(count for _, count in rows)


def test_memory_stays_bounded_whatever_the_number_of_distinct_keys():
    profile = ReuseProfile(100, rate=1.0, max_keys=1000)
    tracemalloc.start()
    profile.reference(range(50_000))
    first, _ = tracemalloc.get_traced_memory()
    profile.reference(range(50_000, 1_000_000))
    second, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert profile.tracked == 1000 and profile.forgotten == 1_000_000 - 1000
    assert second - first < 200_000  # bytes: no growth with 950,000 more distinct keys


def test_bad_settings_are_clear_errors():
    with pytest.raises(ConfigError, match="capacity_blocks must be a positive integer"):
        ReuseProfile(0)
    with pytest.raises(ConfigError, match=r"rate must be in \[2\*\*-24, 1\]"):
        ReuseProfile(10, rate=2.0)
    with pytest.raises(ConfigError, match=r"rate must be in \[2\*\*-24, 1\]"):
        ReuseProfile(10, rate=2.0**-25)  # below the sampling hash's resolution
    for max_keys in (0, 2**28 + 1):
        with pytest.raises(ConfigError, match=r"max_keys must be in \[1, 2\*\*28\]"):
            ReuseProfile(10, max_keys=max_keys)
    for exact_keys in (-1, 2**28 + 1):
        with pytest.raises(ConfigError, match=r"exact_keys must be in \[0, 2\*\*28\]"):
            ReuseProfile(10, exact_keys=exact_keys)


def test_a_rate_between_multiples_of_the_hash_resolution_is_the_share_it_samples():
    """A rate of 1e-7 samples hash bits below round(1e-7 * 2**24) = 2, a share of 2**-23:
    the profile's rate (the counts' unit, exported as kvobs_reuse_sample_rate) is that
    share, so a sample stands for 2**23 references, not the 10**7 asked for."""
    assert ReuseProfile(10, rate=1e-7).rate == 2 / 2**24
    assert ReuseProfile(10, rate=0.3).rate == round(0.3 * 2**24) / 2**24
    assert ReuseProfile(10, rate=0.25).rate == 0.25  # powers of two are kept as given


def test_a_profile_takes_any_iterable():
    profile = ReuseProfile(10, rate=1.0)
    profile.reference(iter(["a", "b", "a"]))
    profile.write(k for k in ["c"])
    assert profile.references == 3 and profile.hit_ratio(2) == pytest.approx(1 / 3)


def test_exact_across_many_compactions_and_the_max_keys_bound():
    # 60,000 references through a 64-key profile: its slot space (4 x 64) is compacted
    # hundreds of times; every size up to max_keys stays exact.
    references = zipf(60_000, 3000, 0.8, seed=9)
    kept = profile_of(references, capacity=8, rate=1.0, max_keys=64, keep_samples=True)
    bucketed = profile_of(references, capacity=8, rate=1.0, max_keys=64)
    assert kept.sampled > 100 * 4 * 64
    for size in (1, 7, 30, 64):
        assert kept.hit_ratio(size) == pytest.approx(exact_lru_hit_ratio(references, size),
                                                     abs=1e-12)
    for size in (b for b in bucketed.bounds if b <= 64):
        assert bucketed.hit_ratio(size) == pytest.approx(
            exact_lru_hit_ratio(references, size), abs=1e-12)


def test_the_one_pass_oracle_is_the_lru_replay():
    """``exact_reuse_distances`` (every distance at once, what benchmarks/reuse_accuracy
    compares with) answers each size as an LRU cache replayed at that size does, writes
    included."""
    import bisect

    from tests.lru_oracle import exact_lru_event_hit_ratio, exact_reuse_distances, mixed_trace

    events = mixed_trace(30_000, seed=3)
    distances, counted = exact_reuse_distances(events)
    assert counted == sum(1 for _, is_lookup in events if is_lookup)
    for size in (1, 7, 100, 1000, 5000, 20_000):
        assert bisect.bisect_right(distances, size) / counted == pytest.approx(
            exact_lru_event_hit_ratio(events, size), abs=1e-12), size
