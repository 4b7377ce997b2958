"""The measured prefill cost's arithmetic at its edges (:mod:`kvobs.benefit`): the
forgetting sums, the solve's ridge and singular bound, the relative error's guards and
variance, and when a fit is used. Each case is one a mutant of the module got past the
older tests (``tests/core/test_benefit_fit.py`` judges the fit as a whole)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from kvobs import benefit
from kvobs.benefit import (
    _FORGET,
    _Z95,
    MAX_RELATIVE_ERROR,
    PrefillCost,
    _relative_error,
    _solve3,
    _t95,
)

Sums = tuple[list[list[float]], list[float], float]


def _sums(rows: list[tuple[float, float, float]], weights: list[float]) -> Sums:
    """``(X'WX, X'Wy, y'Wy)`` over steps ``(prefill, decode, seconds)`` with x = (1, p, d)."""
    xtx = [[0.0] * 3 for _ in range(3)]
    xty = [0.0] * 3
    yty = 0.0
    for (p, d, y), w in zip(rows, weights, strict=True):
        x = (1.0, p, d)
        for i in range(3):
            xty[i] += w * x[i] * y
            for j in range(3):
                xtx[i][j] += w * x[i] * x[j]
        yty += w * y * y
    return xtx, xty, yty


def test_the_normal_equations_are_the_forgetting_weighted_sums_of_the_steps() -> None:
    rng = random.Random(7)
    steps = [(rng.choice([0, 0, 37, 512]), rng.randint(1, 64), 0.0) for _ in range(40)]
    steps = [(p, d, 0.005 + 2e-5 * p + 1e-5 * d + rng.uniform(0, 1e-3)) for p, d, _ in steps]
    cost = PrefillCost()
    for p, d, y in steps:
        cost.observe_step(y, int(p), int(d))
    n = len(steps)
    weights = [_FORGET ** (n - 1 - k) for k in range(n)]
    xtx, xty, yty = _sums(steps, weights)
    assert np.allclose(cost._xtx, xtx, rtol=1e-12) and np.allclose(cost._xty, xty, rtol=1e-12)
    assert cost._yty == pytest.approx(yty, rel=1e-12)
    prefill = [k for k, step in enumerate(steps) if step[0]]
    pxtx, pxty, pyty = _sums([steps[k] for k in prefill], [weights[k] for k in prefill])
    got = cost._prefill_sums()
    assert np.allclose(got[0], pxtx, rtol=1e-12) and np.allclose(got[1], pxty, rtol=1e-12)
    assert got[2] == pytest.approx(pyty, rel=1e-12)


def test_the_ridge_is_1e_9_of_the_trace_added_to_the_diagonal() -> None:
    diagonal = (1e6, 2e6, 4e6)
    a = [[diagonal[i] if i == j else 0.0 for j in range(3)] for i in range(3)]
    ridge = 1e-9 * sum(diagonal)
    solved = _solve3(a, list(diagonal))
    assert solved is not None
    for value, d in zip(solved, diagonal, strict=True):
        assert value == pytest.approx(d / (d + ridge), rel=1e-13, abs=0)


def test_a_pivot_of_1e_12_solves_and_a_smaller_one_is_singular() -> None:
    exact = 9.99999997e-13  # plus its ridge (1e-9 of the trace): exactly 1e-12
    assert exact + 1e-9 * (exact + exact + exact) == 1e-12
    a = [[exact if i == j else 0.0 for j in range(3)] for i in range(3)]
    assert _solve3(a, [1e-12, 2e-12, 3e-12]) == pytest.approx([1.0, 2.0, 3.0])
    small = [[1.5e-12 if i == j else 0.0 for j in range(3)] for i in range(3)]
    assert _solve3(small, [1.5e-12] * 3) == pytest.approx([1.0] * 3)  # 1.5e-12 >= 1e-12
    tiny = [[0.9e-12 if i == j else 0.0 for j in range(3)] for i in range(3)]
    assert _solve3(tiny, [1.0] * 3) is None


def _fitted(rows: list[tuple[float, float, float]]) -> tuple[Sums, Sums, list[float]]:
    steps = _sums(rows, [1.0] * len(rows))
    prefill = _sums([r for r in rows if r[0]], [1.0] * sum(1 for r in rows if r[0]))
    fit = _solve3(steps[0], steps[1])
    assert fit is not None
    return steps, prefill, fit


def test_the_relative_error_takes_the_larger_variance_and_students_t() -> None:
    """Noisy decode-only steps, exact prefill steps: the all-steps variance RSS / (n - 3)
    is the larger one; checked against numpy's solve of the same ridged equations."""
    rng = random.Random(3)
    rows = [(float(p), 8.0, 0.004 + 2e-5 * p) for p in (64, 128, 256, 512, 96, 320)]
    rows += [(0.0, float(d), 0.004 + 1e-5 * d + rng.uniform(-2e-3, 2e-3)) for d in range(1, 15)]
    steps, prefill, fit = _fitted(rows)
    a = np.array(steps[0])
    ridged = a + 1e-9 * np.trace(a) * np.eye(3)
    beta = np.linalg.solve(ridged, np.array(steps[1]))
    x = np.array([[1.0, p, d] for p, d, _ in rows])
    y = np.array([s for _, _, s in rows])
    n, n_p = len(rows), 6
    rss = float(((y - x @ beta) ** 2).sum())
    rss_p = float(((y[:6] - x[:6] @ beta) ** 2).sum())
    assert rss / (n - 3) > rss_p / (n_p - 2)
    column = np.linalg.solve(ridged, np.array([0.0, 1.0, 0.0]))[1]
    expected = (rss / (n - 3) * column) ** 0.5 / beta[1] * _t95(n_p - 2) / _Z95
    assert _relative_error(steps, prefill, fit) == pytest.approx(expected, rel=1e-6)


def _counts(n: float, n_prefill: float) -> tuple[Sums, Sums, list[float]]:
    """Sums whose step counts are ``n`` and ``n_prefill`` (their other entries a
    well-posed fit), for the guards on the counts."""
    xtx = [[n, 10.0, 5.0], [10.0, 300.0, 2.0], [5.0, 2.0, 40.0]]
    steps = (xtx, [1.0, 3.0, 1.0], 1.0)
    prefill = ([[n_prefill, 10.0, 5.0], [10.0, 300.0, 2.0], [5.0, 2.0, 40.0]],
               [1.0, 3.0, 1.0], 1.0)
    return steps, prefill, [0.01, 0.01, 0.001]


@pytest.mark.parametrize("n,n_prefill", [(3.0, 10.0), (10.0, 3.0), (3.0, 4.0)])
def test_three_steps_or_three_prefill_steps_give_no_error_estimate(
    n: float, n_prefill: float
) -> None:
    assert _relative_error(*_counts(n, n_prefill)) == float("inf")


def test_four_steps_and_four_prefill_steps_give_a_finite_error() -> None:
    assert _relative_error(*_counts(4.0, 4.0)) < float("inf")


def test_no_fit_or_a_fit_without_a_positive_prefill_cost_has_no_error() -> None:
    steps, prefill, _ = _counts(10.0, 10.0)
    assert _relative_error(steps, prefill, None) == float("inf")
    assert _relative_error(steps, prefill, [0.01, 0.0, 0.001]) == float("inf")
    assert _relative_error(steps, prefill, [0.01, -1e-5, 0.001]) == float("inf")


def test_equations_whose_prefill_variance_factor_is_not_positive_have_no_error() -> None:
    """Equations no real steps give (the inverse's prefill entry 0 or negative) are
    refused, never a zero or complex error."""
    prefill = ([[10.0, 1.0, 1.0], [1.0, 10.0, 1.0], [1.0, 1.0, 10.0]], [1.0, 1.0, 1.0], 1.0)
    ridge = 1e-9 * (10.0 + 5.0)
    zero = [[10.0, 1.0, 10.0 + ridge], [1.0, 5.0, 0.0], [ridge, 0.0, 0.0]]
    assert _solve3(zero, [0.0, 1.0, 0.0]) == [1.0, 0.0, -1.0]
    assert _relative_error((zero, [1.0, 1.0, 1.0], 1.0), prefill, [0.1, 0.1, 0.1]) == \
        float("inf")
    negative = [[10.0, 0.0, 0.0], [0.0, -1.0, 0.0], [0.0, 0.0, 1.0]]
    assert _relative_error((negative, [1.0, 1.0, 1.0], 1.0), prefill, [0.1, 0.1, 0.1]) == \
        float("inf")


def _refits(monkeypatch: pytest.MonkeyPatch, errors: list[float]) -> list[str]:
    """The source after each solve whose relative error is the next of ``errors``."""
    cost = PrefillCost()
    cost.set(1e-5)
    monkeypatch.setattr(benefit, "_solve3", lambda a, b: [0.0, 2e-5, 0.0])
    sequence = iter(errors)
    monkeypatch.setattr(PrefillCost, "_error", lambda self, fit: next(sequence))
    sources = []
    for _ in errors:
        cost._refit()
        sources.append(cost.source)
    return sources


def test_an_error_of_exactly_the_bound_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    bound = MAX_RELATIVE_ERROR
    assert _refits(monkeypatch, [bound, bound]) == ["configured", "measured"]


def test_a_first_measured_cost_needs_two_passing_solves_in_a_row(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert _refits(monkeypatch, [0.05, 0.5, 0.05, 0.5, 0.05, 0.05, 0.05]) == [
        "configured", "configured", "configured", "configured", "configured", "measured",
        "measured"]
