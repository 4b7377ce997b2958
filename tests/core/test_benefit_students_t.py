"""Student's t 97.5% quantile of the prefill fit's error (:func:`kvobs.benefit._t95`),
against the known quantiles (the two-sided 95% values of the t tables, to seven digits).

The quantile is the Cornish-Fisher series to its ``1 / dof**2`` term: below the true one at
every ``dof``, by 0.54% at 6 (the fewest the fit judges at its 8 prefill steps) and by
less each step up, far below under 6. Each shortfall is pinned to a thousandth of a
percent, so a change to any coefficient of the series moves one of them out."""

from __future__ import annotations

import pytest

from kvobs.benefit import _Z95, _t95

# dof: (Student's t 97.5% quantile, the series' shortfall in percent)
QUANTILES = {
    1: (12.7062047, -43.691),
    2: (4.3026527, -10.480),
    3: (3.1824463, -3.711),
    4: (2.7764451, -1.693),
    5: (2.5705818, -0.905),
    6: (2.4469119, -0.538),
    8: (2.3060041, -0.234),
    10: (2.2281389, -0.122),
    20: (2.0859634, -0.016),
    30: (2.0422725, -0.005),
    60: (2.0002978, -0.001),
    120: (1.9799304, 0.000),
}


@pytest.mark.parametrize("dof", sorted(QUANTILES))
def test_the_quantile_falls_short_of_students_t_by_the_series_known_error(dof: int) -> None:
    quantile, shortfall = QUANTILES[dof]
    assert 100 * (_t95(dof) / quantile - 1) == pytest.approx(shortfall, abs=1e-3)


@pytest.mark.parametrize(("dof", "quantile"), [(6, 2.447), (10, 2.228), (30, 2.042)])
def test_from_six_degrees_of_freedom_it_is_within_the_documented_0_6_percent(
        dof: int, quantile: float) -> None:
    assert _t95(dof) == pytest.approx(quantile, rel=6e-3)
    assert _t95(dof) < quantile + 5e-4


def test_it_is_never_above_students_t_and_falls_with_every_degree_of_freedom() -> None:
    values = [_t95(dof) for dof in sorted(QUANTILES)]
    assert all(v < QUANTILES[d][0] for d, v in zip(sorted(QUANTILES), values, strict=True))
    assert values == sorted(values, reverse=True)


def test_with_unbounded_degrees_of_freedom_it_is_the_normal_quantile() -> None:
    assert _t95(1e9) == pytest.approx(1.959964, abs=1e-8)
    assert _t95(1e9) == pytest.approx(_Z95, abs=1e-8)
    assert _t95(1e9) > _Z95
