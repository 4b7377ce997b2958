"""Tick labels and legends of `kvobs report` read like Grafana's."""

from __future__ import annotations

import pytest

from kvobs.report.fetch import legend
from kvobs.report.units import format_value


@pytest.mark.parametrize(
    "value,unit,text",
    [
        (0, "bytes", "0 B"),
        (1536, "bytes", "1.5 KiB"),
        (3 * 1024**3, "bytes", "3 GiB"),
        (2.5e9, "Bps", "2.5 GB/s"),
        (999, "Bps", "999 B/s"),
        (2.5e-5, "s", "25 µs"),
        (0.0042, "s", "4.2 ms"),
        (12, "s", "12 s"),
        (0, "s", "0 s"),
        (0.5, "percentunit", "50%"),
        (1, "percentunit", "100%"),
        (12_500, "short", "12.5k"),
        (3, "short", "3"),
        (float("nan"), "short", "nan"),
    ],
)
def test_format_value(value: float, unit: str, text: str) -> None:
    assert format_value(value, unit) == text


def test_legend_fills_labels_and_drops_missing_ones() -> None:
    assert (
        legend("p99 {{src_tier}} → {{ dst_tier }}", {"src_tier": "host", "dst_tier": "gpu"})
        == "p99 host → gpu"
    )
    assert legend("{{tier}} {{state}}", {"tier": "gpu"}) == "gpu"
