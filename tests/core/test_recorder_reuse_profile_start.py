"""How the recorder sizes the reuse profile it starts: in GPU blocks whichever tier was
registered first, at least one block, at the rate asked for; and what its snapshot
exports of a profile (started by hand included)."""

from __future__ import annotations

from kvobs.recorder import Recorder
from kvobs.snapshot import ReuseSnapshot


def reuse(rec: Recorder) -> ReuseSnapshot:
    found = rec.snapshot().reuse
    assert found is not None
    return found


def test_the_profile_counts_gpu_blocks_even_when_another_tier_came_first() -> None:
    rec = Recorder()
    rec.add_tier("host", 256, block_tokens=32, block_bytes=0)  # 8192 tokens
    rec.add_tier("gpu", 64, block_tokens=16, block_bytes=0)
    assert reuse(rec).capacity_blocks == 8192 // 16
    assert rec.key_tokens == 16


def test_one_token_blocks_size_the_profile_in_tokens() -> None:
    rec = Recorder()
    rec.add_tier("gpu", 64, block_tokens=1, block_bytes=0)
    assert reuse(rec).capacity_blocks == 64


def test_a_tier_without_capacity_still_gets_a_one_block_profile() -> None:
    rec = Recorder()
    rec.add_tier("gpu", 0, block_tokens=16, block_bytes=0)
    assert reuse(rec).capacity_blocks == 1


def test_the_profile_takes_the_rate_asked_for() -> None:
    rec = Recorder()
    rec.add_tier("gpu", 64, block_tokens=16, block_bytes=0)
    profile = rec.start_reuse_profile(rate=0.5)
    assert profile is not None and profile.rate == 0.5
    assert reuse(rec).rate == 0.5


def test_the_snapshot_exports_the_profiles_exact_blocks() -> None:
    rec = Recorder()
    rec.add_tier("gpu", 64, block_tokens=16, block_bytes=0)
    profile = rec.start_reuse_profile()
    assert profile is not None and profile.exact_blocks > 0
    assert reuse(rec).exact_blocks == profile.exact_blocks


def test_a_profile_started_by_hand_is_exported_where_the_recorder_keeps_none() -> None:
    rec = Recorder(profile_reuse=False)
    rec.add_tier("gpu", 64, block_tokens=16, block_bytes=0)
    assert rec.snapshot().reuse is None
    rec.start_reuse_profile(capacity_blocks=100)
    assert reuse(rec).capacity_blocks == 100
