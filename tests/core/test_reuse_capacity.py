"""The reuse profile's 1x size is the number of distinct blocks the engine's tiers hold:
the largest tier where the tiers keep copies of each other (every engine kvobs reads),
their sum where a block lives in one tier at a time (the reference pool)."""

from __future__ import annotations

import pytest

from kvobs.recorder import Recorder


def profile_capacity(exclusive: bool) -> int:
    rec = Recorder(exclusive_tiers=exclusive)
    rec.add_tier("gpu", capacity_blocks=255, block_tokens=16, block_bytes=4096)
    rec.add_tier("host", capacity_blocks=48, block_tokens=64, block_bytes=16384)  # 192 gpu
    rec.lookup(32, keys=["a", "b"])  # the first keyed lookup starts the profile
    assert rec.reuse is not None
    return rec.reuse.capacity_blocks


@pytest.mark.parametrize(("exclusive", "blocks"), [(False, 255), (True, 255 + 192)])
def test_the_profile_is_sized_at_the_distinct_blocks_the_tiers_hold(exclusive, blocks):
    assert profile_capacity(exclusive) == blocks


def test_a_larger_host_tier_bounds_an_inclusive_cache():
    rec = Recorder()
    rec.add_tier("gpu", capacity_blocks=100, block_tokens=16, block_bytes=4096)
    rec.add_tier("host", capacity_blocks=400, block_tokens=16, block_bytes=4096)
    assert rec.start_reuse_profile().capacity_blocks == 400


def test_the_profile_is_exported_from_zero_before_the_first_lookup():
    """Started at the first collection once a tier exists: a scrape before any traffic
    reads its counters at 0, so rate() over the first scrapes counts every reference
    (started at the first lookup, they appeared already counting)."""
    rec = Recorder()
    assert rec.snapshot().reuse is None  # no tier yet: no size to build buckets on
    rec.add_tier("gpu", capacity_blocks=64, block_tokens=16, block_bytes=4096)
    before = rec.snapshot().reuse
    assert before is not None and before.references == 0 and before.capacity_blocks == 64
    assert {count for _bound, count in before.cumulative} == {0}
    rec.lookup(32, keys=["a", "b"])
    assert rec.snapshot().reuse.references == 2


def test_no_profile_where_it_is_turned_off():
    rec = Recorder(profile_reuse=False)
    rec.add_tier("gpu", capacity_blocks=64, block_tokens=16, block_bytes=4096)
    assert rec.snapshot().reuse is None
