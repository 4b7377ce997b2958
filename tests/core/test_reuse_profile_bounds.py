"""A reuse profile's bounds at their edges (:class:`kvobs.reuse.ReuseProfile`): ``max_keys``
and ``exact_keys`` of exactly 2**28 taken (the C core's tables grow lazily, so nothing that
large is allocated) and one more refused naming the field, a rate of exactly 2**-24 taken,
the default rate sized by the profile's own ``max_keys``, the exact stack holding only
``exact_keys`` blocks, and a sample that tracked no reference predicting no hits."""

from __future__ import annotations

import pytest

from kvobs.errors import ConfigError
from kvobs.reuse import MAX_KEYS_LIMIT, ReuseProfile


def test_max_keys_of_exactly_2_to_the_28_is_taken_and_one_more_is_refused() -> None:
    assert MAX_KEYS_LIMIT == 2 ** 28
    profile = ReuseProfile(1, rate=1.0, max_keys=2 ** 28)
    profile.reference(["a", "a"])
    assert (profile.max_keys, profile.hit_ratio(1)) == (2 ** 28, 0.5)
    with pytest.raises(ConfigError, match=r"max_keys must be in \[1, 2\*\*28\], got 268435457"):
        ReuseProfile(1, rate=1.0, max_keys=2 ** 28 + 1)


def test_exact_keys_of_exactly_2_to_the_28_is_taken_and_one_more_is_refused() -> None:
    sampled = ReuseProfile(64, rate=0.25, max_keys=8, exact_keys=2 ** 28)
    assert (sampled.exact_keys, sampled.exact_blocks) == (2 ** 28, 2 ** 28)
    exact = ReuseProfile(64, rate=1.0, exact_keys=2 ** 28)  # rate 1: no exact stack needed
    assert exact.exact_keys == 0
    with pytest.raises(ConfigError, match=r"exact_keys must be in \[0, 2\*\*28\] \(0: none\), "
                                          r"got 268435457"):
        ReuseProfile(64, rate=0.25, max_keys=8, exact_keys=2 ** 28 + 1)


def test_a_rate_of_exactly_2_to_the_minus_24_is_taken_and_less_is_refused() -> None:
    profile = ReuseProfile(1, rate=2.0 ** -24, max_keys=8)
    assert profile.rate == 2.0 ** -24
    with pytest.raises(ConfigError, match=r"rate must be in \[2\*\*-24, 1\]"):
        ReuseProfile(1, rate=2.0 ** -25, max_keys=8)


def test_the_default_rate_is_sized_by_the_profiles_own_max_keys() -> None:
    """A horizon of 16x 1,000 blocks needs 8 / rate >= 16,000: 2**-11 (with the default
    max_keys, 131,072 keys would cover it at rate 1)."""
    assert ReuseProfile(1000, max_keys=8).rate == 2.0 ** -11
    assert ReuseProfile(1000).rate == 1.0


def test_the_exact_stack_holds_only_exact_keys_blocks() -> None:
    """A loop of 8 blocks (each back at distance 8) at a rate that tracks none of them:
    an exact stack of 8 finds every return (9 of 10 references hit 8 blocks); one of 2
    finds none, and the sample, holding none of them, counts no hit at 8 blocks."""
    loop = list(range(8)) * 10
    wide = ReuseProfile(8, rate=2.0 ** -10, adaptive=False, exact_keys=8)
    wide.reference(loop)
    assert wide.hit_ratio(8) == pytest.approx(0.9)
    narrow = ReuseProfile(8, rate=2.0 ** -10, adaptive=False, exact_keys=2)
    narrow.reference(loop)
    assert (narrow.exact_blocks, narrow.tracked, narrow.references) == (2, 0, 80)
    assert narrow.hit_ratio(2) == 0.0
    assert narrow.hit_ratio(8) == 0.0


def test_a_sample_that_tracked_no_reference_predicts_no_hits() -> None:
    """References counted, none of them sampled (plain SHARDS at 2**-20, no exact stack):
    nothing to estimate from, so no hit at any size (not the SHARDS-adj correction's
    "every reference expected but missing was a hit")."""
    profile = ReuseProfile(8, rate=2.0 ** -20, adaptive=False, exact_keys=0)
    profile.reference(list(range(20)) * 3)
    assert (profile.references, profile.sampled, profile.tracked) == (60, 0.0, 0)
    assert [profile.hit_ratio(size) for size in (1, 8, 20, 1000)] == [0.0, 0.0, 0.0, 0.0]
