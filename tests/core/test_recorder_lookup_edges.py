"""Recorder.lookup at its edges: disk hits beyond the looked-up tokens, disk hits and
their saved prefill adding up over lookups, a reuse profile started by hand where the
recorder does not start one, unknown causes adding up where no block size is known, and
a miss explainer's answers clamped to what it was asked about (and its failure logged)."""

from __future__ import annotations

import structlog

from kvobs.recorder import Recorder

BLOCK = 16


def recorder(profile_reuse: bool = True) -> Recorder:
    rec = Recorder(profile_reuse=profile_reuse)
    rec.add_tier("gpu", 8, block_tokens=BLOCK, block_bytes=0)
    return rec


def blocks(prefix: str, n: int) -> list[str]:
    return [f"{prefix}{i}" for i in range(n)]


def test_disk_hits_beyond_the_looked_up_tokens_raise_the_tokens() -> None:
    rec = recorder()
    rec.lookup(10, disk_hit=16)
    lookups = rec.snapshot().lookups
    assert (lookups.tokens, lookups.disk_hit, lookups.miss) == (16, 16, 0)


def test_disk_hits_add_up_over_lookups() -> None:
    rec = recorder()
    rec.lookup(100, gpu_hit=10, host_hit=20, disk_hit=30)
    rec.lookup(100, disk_hit=5)
    assert rec.snapshot().lookups.outcomes() == {"gpu_hit": 10, "host_hit": 20,
                                                 "disk_hit": 35, "miss": 135}


def test_saved_prefill_of_disk_hits_adds_up_over_lookups() -> None:
    rec = recorder()
    rec.prefill_cost.set(0.25)
    rec.lookup(100, disk_hit=10)
    rec.lookup(100, host_hit=4, disk_hit=20)
    benefit = rec.snapshot().benefit
    assert (benefit.host_saved_s, benefit.disk_saved_s) == (1.0, 7.5)


def test_a_profile_started_by_hand_classifies_misses_where_the_recorder_starts_none() -> None:
    rec = recorder(profile_reuse=False)
    assert rec.snapshot().reuse is None
    rec.start_reuse_profile()
    rec.lookup(2 * BLOCK, keys=blocks("a", 2))
    rec.lookup(2 * BLOCK, keys=blocks("a", 2))
    snap = rec.snapshot()
    causes = snap.lookups.miss_causes()
    assert (causes["cold"], causes["other"], causes["unknown"]) == (2 * BLOCK, 2 * BLOCK, 0)
    assert snap.reuse is not None and snap.reuse.references == 4


def test_without_a_profile_unknown_misses_add_up_over_keyed_lookups() -> None:
    rec = recorder(profile_reuse=False)
    rec.lookup(2 * BLOCK, keys=blocks("a", 2))
    rec.lookup(3 * BLOCK, gpu_hit=BLOCK, keys=blocks("a", 3))
    assert rec.snapshot().lookups.miss_causes()["unknown"] == 4 * BLOCK


def test_a_profile_started_before_any_tier_leaves_misses_unknown_and_adding_up() -> None:
    rec = Recorder()
    rec.start_reuse_profile(capacity_blocks=64)  # no tier: no block size for the keys
    rec.lookup(2 * BLOCK, keys=blocks("a", 2))
    rec.lookup(2 * BLOCK, keys=blocks("a", 2))
    snap = rec.snapshot()
    causes = snap.lookups.miss_causes()
    assert causes["unknown"] == 4 * BLOCK == snap.lookups.miss
    assert snap.reuse is not None and snap.reuse.references == 4


def test_an_explainer_that_finds_nothing_or_answers_below_zero_leaves_the_misses_other() -> None:
    for answer in ((0, 0), (-3, -1)):
        rec = recorder()
        rec.lookup(2 * BLOCK, keys=blocks("a", 2))
        rec.miss_explainer = lambda keys, answer=answer: answer
        rec.lookup(2 * BLOCK, keys=blocks("a", 2))
        causes = rec.snapshot().lookups.miss_causes()
        assert (causes["dropped"], causes["in_flight"], causes["other"]) == (0, 0, 2 * BLOCK)


def test_in_flight_misses_add_up_over_lookups() -> None:
    rec = recorder()
    rec.lookup(2 * BLOCK, keys=blocks("a", 2))
    rec.miss_explainer = lambda keys: (0, 1)
    rec.lookup(2 * BLOCK, keys=blocks("a", 2))
    rec.lookup(2 * BLOCK, keys=blocks("a", 2))
    causes = rec.snapshot().lookups.miss_causes()
    assert (causes["in_flight"], causes["other"]) == (2 * BLOCK, 2 * BLOCK)


def test_a_failing_explainer_is_logged_with_its_exception() -> None:
    rec = recorder()
    rec.lookup(2 * BLOCK, keys=blocks("a", 2))

    def broken(keys: object) -> tuple[int, int]:
        raise RuntimeError("adapter bug")

    rec.miss_explainer = broken
    with structlog.testing.capture_logs() as logs:
        rec.lookup(2 * BLOCK, keys=blocks("a", 2))
    assert [(e["component"], e["error"]) for e in logs] == [
        ("recorder.miss_explainer", "RuntimeError('adapter bug')")
    ]
