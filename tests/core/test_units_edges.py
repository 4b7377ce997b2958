"""Human units at their edges (:mod:`kvobs.units`): where a duration changes its unit,
the labels of zero and of non-finite values, the byte axis's binary ticks and each
unit's axis label. Each case is one a mutant of the module got past the older tests."""

from __future__ import annotations

import math

import pytest

from kvobs.units import binary_ticks, describe, format_value


@pytest.mark.parametrize(
    "value,text",
    [
        (0.0, "0 s"),
        (-0.0, "0 s"),
        (1.0, "1 s"),
        (123.4999e-6, "123 µs"),  # 123.5 µs would read 124 µs
        (999.4995e-6, "999 µs"),  # a hair more reads 1 ms
        (0.0009996, "1 ms"),  # rounds to 1,000 µs: the next unit instead
        (0.1234, "123 ms"),
        (0.9994, "999 ms"),
        (-0.0025, "-2.5 ms"),
    ],
)
def test_a_duration_reads_in_the_unit_that_keeps_it_below_1000(value: float, text: str) -> None:
    assert format_value(value, "s") == text


@pytest.mark.parametrize("unit", ["bytes", "Bps", "s", "percentunit", "short"])
def test_a_value_that_is_not_finite_reads_as_python_writes_it(unit: str) -> None:
    assert format_value(math.nan, unit) == "nan"
    assert format_value(math.inf, unit) == "inf"
    assert format_value(-math.inf, unit) == "-inf"


@pytest.mark.parametrize(
    "vmin,vmax,ticks",
    [
        (0, 3, [0, 1, 2, 3]),  # a step of 1 at least, never a fraction
        (0, 52, [0, 16, 32, 48, 64]),  # 52 / 6 bins: a step of 16 (8 would need 7 bins)
        (100, 152, [96, 112, 128, 144, 160]),  # the ticks start at or below vmin
        (-40, -1, [-40, -32, -24, -16, -8, 0]),
    ],
)
def test_binary_ticks_take_the_smallest_power_of_two_step_within_six_bins(
    vmin: float, vmax: float, ticks: list[float]
) -> None:
    assert binary_ticks(vmin, vmax) == ticks


def test_binary_ticks_of_an_empty_or_non_finite_range() -> None:
    assert binary_ticks(5, 5) == [5]
    assert binary_ticks(5, 4) == [5]
    assert binary_ticks(0, math.inf) == [0]
    assert binary_ticks(math.nan, 10) == []
    assert binary_ticks(-math.inf, 10) == []


@pytest.mark.parametrize(
    "unit,label",
    [("bytes", "bytes"), ("Bps", "bytes/s"), ("s", "seconds"), ("percentunit", "share"),
     ("short", ""), ("ops", "ops")],
)
def test_each_unit_describes_its_axis(unit: str, label: str) -> None:
    assert describe(unit) == label
