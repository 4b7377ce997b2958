"""The reuse profile's arithmetic at its edges (:mod:`kvobs.reuse`): the default rate's
floor and its horizon bound, a profile with nothing counted, the interpolation's ends and
the SHARDS-adj ratio's guards."""

from __future__ import annotations

import pytest

from kvobs.errors import ConfigError
from kvobs.reuse import (
    BUCKET_FACTORS,
    DEFAULT_MAX_KEYS,
    ReuseProfile,
    adjusted_hit_ratio,
    default_rate,
    hit_ratios,
    interpolate,
)


def test_the_default_rate_halves_until_the_horizon_covers_16x_the_capacity() -> None:
    assert BUCKET_FACTORS[-1] == 16.0
    exact = DEFAULT_MAX_KEYS // 16  # a horizon of exactly 16x: no need to sample
    assert default_rate(exact) == 1.0
    assert default_rate(exact + 1) == 0.5
    assert default_rate(4 * exact) == 0.25
    assert default_rate(100, max_keys=1600) == 1.0
    assert default_rate(100, max_keys=1599) == 0.5


def test_the_default_rate_stops_at_the_sampling_hashs_resolution() -> None:
    assert default_rate(1 << 40, max_keys=1) == 2.0 ** -24
    assert default_rate(1 << 40, max_keys=1, max_rate=0.25) == 2.0 ** -24


def test_a_profile_with_nothing_counted_hits_nothing() -> None:
    assert ReuseProfile(8, rate=1.0).hit_ratio(4) == 0.0
    written = ReuseProfile(8, rate=1.0)
    written.write(["a", "b"])  # in the cache, never looked up: nothing counted
    assert (written.references, written.hit_ratio(4)) == (0, 0.0)


def test_interpolation_has_no_points_then_rises_from_zero_to_the_first_bound() -> None:
    assert interpolate([], 5) == 0.0
    assert interpolate([(10, 0.2)], 0.5) == pytest.approx(0.01)
    assert interpolate([(10, 0.2)], -3) == 0.0
    assert interpolate([(10, 0.2), (20, 0.4)], 10) == pytest.approx(0.2)


def test_the_adjusted_ratio_guards_an_empty_window_and_stays_within_0_and_1() -> None:
    assert adjusted_hit_ratio(0, 0, 0, 1.0) == 0.0
    assert adjusted_hit_ratio(5, 5, 0, 0.5) == 0.0
    assert adjusted_hit_ratio(hits=20, sampled=10, total=10, rate=1.0) == 1.0
    assert adjusted_hit_ratio(hits=0, sampled=30, total=10, rate=1.0) == 0.0
    assert adjusted_hit_ratio(hits=4, sampled=10, total=10, rate=1.0) == pytest.approx(0.4)


def test_hit_ratios_pairs_each_size_with_the_profiles_ratio() -> None:
    profile = ReuseProfile(8, rate=1.0, keep_samples=True)
    profile.reference(["a", "b", "a", "c", "a"])  # a again at distance 2, then at 2
    assert hit_ratios(profile, [1, 2, 8]) == [(1, 0.0), (2, pytest.approx(0.4)),
                                              (8, pytest.approx(0.4))]
    assert hit_ratios(profile, []) == []


def mixed(profile: ReuseProfile) -> ReuseProfile:
    """A hot block at distance 1 (10 times), 100 blocks at distance 100 (900 hits), then
    300 at distance 300 (2,700): 4,020 references."""
    for _ in range(10):
        profile.reference(["h", "h"])
        profile.reference([f"a{i}" for i in range(100)])
    for _ in range(10):
        profile.reference([f"b{i}" for i in range(300)])
    return profile


def test_an_exact_stack_below_a_sampled_one_adds_up_to_the_exact_answer() -> None:
    """Distances up to exact_keys (32) from the exact stack, farther ones from the sampled
    counts added bucket by bucket: the same ratios as an exact profile at every bound."""
    merged, exact = mixed(ReuseProfile(64, rate=0.25, exact_keys=32)), mixed(ReuseProfile(64))
    assert (merged.exact_keys, exact.rate) == (32, 1.0)
    for size in (8, 32, 64, 128, 256, 384, 1024):
        assert merged.hit_ratio(size) == pytest.approx(exact.hit_ratio(size), abs=1e-9)
    assert exact.hit_ratio(8) == pytest.approx(10 / 4020)
    # the hot block comes back after 100 others 9 times: at distance 101
    assert exact.hit_ratio(128) == pytest.approx((10 + 9 + 900) / 4020)
    assert exact.hit_ratio(384) == pytest.approx((10 + 9 + 900 + 2700) / 4020)


@pytest.mark.parametrize("capacity", [True, 0, -1, 1.5])
def test_a_profiles_capacity_is_a_positive_integer(capacity: object) -> None:
    with pytest.raises(ConfigError, match=r"capacity_blocks must be a positive integer"):
        ReuseProfile(capacity)  # type: ignore[arg-type]


def test_the_smallest_profile_is_one_block_and_one_key() -> None:
    profile = ReuseProfile(1, rate=1.0, max_keys=1)
    profile.reference(["a", "a"])
    assert profile.hit_ratio(1) == pytest.approx(0.5)
    with pytest.raises(ConfigError, match=r"max_keys must be in \[1, 2\*\*28\], got 0"):
        ReuseProfile(1, max_keys=0)
