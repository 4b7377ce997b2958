"""Host and disk hits before the first prefill cost are credited at that cost, never lost.

Issue 46: on a CPU engine the measured cost took 600 s; the hits of that time were never
counted as saved. Now they are held while the cost is unknown and credited when one is
known (configured or measured), so the saved seconds are every hit token x the cost.
"""

from __future__ import annotations

import pytest

from kvobs.benefit import PrefillCost
from kvobs.recorder import Recorder
from kvobs.testing import capture_telemetry

COST = 4.83e-4  # the CPU engine's measured seconds per prefill token (issue 46)


def measure(rec: Recorder, cost: float = COST) -> None:
    """Engine steps whose time the prefill tokens explain exactly, until measured."""
    for step in range(64):
        prefill = (step % 4) * 100
        rec.step(0.02 + cost * prefill + 1e-3 * 8, prefill, 8)
    assert rec.prefill_cost.source == "measured"


def test_hits_before_a_measured_cost_are_credited_at_it() -> None:
    rec = Recorder()
    rec.lookup(1000, gpu_hit=100, host_hit=600, disk_hit=100)
    rec.relookup(500, host_hit=200, disk_hit=50)  # a preempted request's re-lookup
    before = rec.snapshot().benefit
    assert (before.host_saved_s, before.disk_saved_s) == (0.0, 0.0)  # unknown: no guess
    assert (rec.prefill_cost.held_host_tokens, rec.prefill_cost.held_disk_tokens) == (800, 150)
    with capture_telemetry(rec) as telemetry:
        assert "kvobs_prefill_cost_seconds" not in telemetry.collect()  # a gap, not 0
        assert telemetry.value("kvobs_prefill_cost_info", source="none") == 1
        measure(rec)
        cost = rec.prefill_cost.seconds_per_token
        assert cost == pytest.approx(COST)
        rec.lookup(400, host_hit=300, disk_hit=25)
        rec.relookup(100, host_hit=100)
        benefit = rec.snapshot().benefit
        host, disk = 600 + 200 + 300 + 100, 100 + 50 + 25
        assert benefit.host_saved_s == pytest.approx(host * cost, rel=1e-12)
        assert benefit.disk_saved_s == pytest.approx(disk * cost, rel=1e-12)
        assert telemetry.value("kvobs_prefill_saved_seconds_total", tier="host") == \
            pytest.approx(host * cost, rel=1e-12)
        assert telemetry.value("kvobs_prefill_cost_seconds") == pytest.approx(cost)
    snap = rec.snapshot()  # every host-hit token the recorder counted, at the cost
    assert snap.lookups.host_hit + snap.relookups.host_hit == host
    assert (rec.prefill_cost.held_host_tokens, rec.prefill_cost.held_disk_tokens) == (0, 0)


def test_a_configured_cost_set_late_credits_the_held_hits() -> None:
    rec = Recorder()
    rec.lookup(1000, host_hit=500)
    rec.prefill_cost.set(2e-5)  # KVOBS_PREFILL_SECONDS_PER_TOKEN, read at telemetry start
    rec.lookup(1000, host_hit=300)
    assert rec.snapshot().benefit.host_saved_s == pytest.approx(800 * 2e-5)


def test_hits_held_while_a_measured_cost_fell_back_to_none_wait_for_the_next_one() -> None:
    """A measured cost that turns poor falls back to none: the hits of that time are held
    again and credited at the next cost, those before at the cost of their time."""
    cost = PrefillCost()
    cost.hold(100, 0)
    cost._use(1e-4, "measured")  # a fit passed
    assert (cost.backlog_host_s, cost.held_host_tokens) == (pytest.approx(1e-2), 0)
    cost._use(0.0, "none")  # the fit turned poor, nothing configured
    assert cost.hold(50, 10) == 0.0
    cost.set(3e-5)
    assert cost.backlog_host_s == pytest.approx(100 * 1e-4 + 50 * 3e-5)
    assert cost.backlog_disk_s == pytest.approx(10 * 3e-5)
    assert cost.hold(7, 7) == 3e-5  # known now: the caller credits them itself
    assert (cost.held_host_tokens, cost.held_disk_tokens) == (0, 0)


def test_a_known_cost_of_zero_holds_nothing() -> None:
    cost = PrefillCost()
    cost.set(0.0)
    assert cost.hold(100, 100) == 0.0
    assert (cost.held_host_tokens, cost.backlog_host_s) == (0, 0.0)
