"""Human units of ``kvobs top`` and ``kvobs report`` (:mod:`kvobs.units`): a figure
reads below its base in at most three significant digits, never with an exponent."""

from __future__ import annotations

import re

import pytest

from kvobs.units import format_value

KIB, MIB, GIB, TIB = 1024, 1024**2, 1024**3, 1024**4


@pytest.mark.parametrize(
    "value,text",
    [
        (0, "0 B"),
        (999, "999 B"),
        (1000, "1,000 B"),
        (1023, "1,023 B"),
        (1024, "1 KiB"),
        (1536, "1.5 KiB"),
        (1_000_000, "977 KiB"),
        (1010 * KIB, "1,010 KiB"),
        (1023 * KIB, "1,023 KiB"),
        (MIB - 1, "1 MiB"),  # 1023.999 KiB would read 1,024 KiB: the next unit instead
        (1_048_576, "1 MiB"),
        (1.01 * MIB, "1.01 MiB"),
        (1e12, "931 GiB"),
        (1010 * GIB, "1,010 GiB"),
        (1.5 * TIB, "1.5 TiB"),
        (3 * 1024**6, "3,072 PiB"),  # past the last unit: whole, never 3.07e+03
        (-2048, "-2 KiB"),
    ],
)
def test_bytes_read_below_1024_of_their_unit(value: float, text: str) -> None:
    assert format_value(value, "bytes") == text


@pytest.mark.parametrize(
    "value,unit,text",
    [
        (999, "Bps", "999 B/s"),
        (999.7, "Bps", "1 kB/s"),  # would round to 1e+03 B/s
        (1_234, "Bps", "1.23 kB/s"),
        (999.7, "short", "1k"),
        (0.0009994, "s", "999 µs"),
        (0.9996, "s", "1 s"),  # would round to 1e+03 ms
        (1234.5, "s", "1,234 s"),
        (12.5, "percentunit", "1,250%"),
    ],
)
def test_other_units_never_round_up_to_an_exponent(value: float, unit: str, text: str) -> None:
    assert format_value(value, unit) == text


@pytest.mark.parametrize("unit", ["bytes", "Bps", "s", "short", "percentunit"])
def test_no_label_has_an_exponent_or_more_than_four_digits(unit: str) -> None:
    values = [m * 10.0**e for e in range(-3, 16) for m in (1, 1.0049, 9.99, 99.96, 999.6, 1023.6)]
    for value in values:
        label = format_value(value, unit)
        assert "e+" not in label and "e-" not in label, (value, label)
        digits = re.sub(r"[^0-9]", "", label.split(".")[0])
        assert len(digits) <= 4 or unit in ("s", "percentunit"), (value, label)
