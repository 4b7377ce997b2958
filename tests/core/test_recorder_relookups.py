"""Re-lookups of preempted requests: exported from zero once tracked, each outcome adding
up over re-lookups apart from the lookups, and their host and disk hits credited as
saved prefill (held while the cost is unknown, credited when it becomes known)."""

from __future__ import annotations

from kvobs.recorder import Recorder
from kvobs.snapshot import LookupSnapshot


def relookups(rec: Recorder) -> LookupSnapshot:
    found = rec.snapshot().relookups
    assert found is not None
    return found


def test_tracked_relookups_are_exported_from_zero() -> None:
    rec = Recorder()
    assert rec.snapshot().relookups is None
    rec.track_relookups()
    r = relookups(rec)
    assert (r.lookups, r.tokens, r.gpu_hit, r.host_hit, r.disk_hit) == (0, 0, 0, 0, 0)


def test_a_relookup_without_hits_counts_all_its_tokens_as_missed() -> None:
    rec = Recorder()
    rec.relookup(64)
    r = relookups(rec)
    assert (r.lookups, r.tokens, r.gpu_hit, r.host_hit, r.disk_hit) == (1, 64, 0, 0, 0)
    assert r.miss == 64


def test_each_relookup_outcome_adds_up_over_relookups_apart_from_the_lookups() -> None:
    rec = Recorder()
    rec.relookup(100, gpu_hit=10, host_hit=20, disk_hit=30)
    rec.relookup(40, gpu_hit=8, host_hit=16, disk_hit=32)  # hits beyond the tokens raise them
    r = relookups(rec)
    assert (r.lookups, r.tokens, r.gpu_hit, r.host_hit, r.disk_hit) == (2, 156, 18, 36, 62)
    assert r.miss == 40
    assert rec.snapshot().lookups.lookups == 0


def test_a_relookups_host_hits_are_held_until_the_prefill_cost_is_known() -> None:
    rec = Recorder()
    rec.relookup(64, host_hit=32)
    assert rec.snapshot().benefit.host_saved_s == 0.0
    rec.prefill_cost.set(0.5)
    assert rec.snapshot().benefit.host_saved_s == 16.0


def test_a_relookups_disk_hits_are_held_until_the_prefill_cost_is_known() -> None:
    rec = Recorder()
    rec.relookup(64, disk_hit=8)
    rec.prefill_cost.set(0.5)
    assert rec.snapshot().benefit.disk_saved_s == 4.0


def test_saved_prefill_of_relookup_disk_hits_adds_up_at_the_known_cost() -> None:
    rec = Recorder()
    rec.prefill_cost.set(0.25)
    rec.relookup(100, disk_hit=8)
    rec.relookup(100, host_hit=4, disk_hit=8)
    benefit = rec.snapshot().benefit
    assert (benefit.host_saved_s, benefit.disk_saved_s) == (1.0, 4.0)
