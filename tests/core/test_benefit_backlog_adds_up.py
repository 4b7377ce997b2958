"""The seconds credited for held hits add up over every time a cost became known
(:meth:`kvobs.benefit.PrefillCost._use`): the disk tier's as well as the host's."""

from __future__ import annotations

import pytest

from kvobs.benefit import PrefillCost


def test_each_credit_of_held_hits_adds_to_the_backlog_of_both_tiers() -> None:
    cost = PrefillCost()
    cost.hold(100, 10)
    cost._use(1e-4, "measured")  # a fit passed: the held hits are credited at it
    assert (cost.backlog_host_s, cost.backlog_disk_s) == (pytest.approx(1e-2), pytest.approx(1e-3))
    cost._use(0.0, "none")  # the fit turned poor, nothing configured: hits held again
    assert cost.hold(50, 5) == 0.0
    assert (cost.backlog_host_s, cost.backlog_disk_s) == (pytest.approx(1e-2), pytest.approx(1e-3))
    cost.set(3e-5)
    assert cost.backlog_host_s == pytest.approx(100 * 1e-4 + 50 * 3e-5)
    assert cost.backlog_disk_s == pytest.approx(10 * 1e-4 + 5 * 3e-5)
    assert (cost.held_host_tokens, cost.held_disk_tokens) == (0, 0)
