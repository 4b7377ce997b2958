"""Tick labels and legends of `kvobs report` read like Grafana's."""

from __future__ import annotations

import re

import pytest

from kvobs.report.fetch import legend
from kvobs.units import binary_ticks, format_value


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


@pytest.mark.parametrize(
    "vmin,vmax,ticks",
    [
        (0, 37 * 1024**3, [0, 8, 16, 24, 32, 40]),
        (0, 3.5 * 1024**3, [0, 1, 2, 3, 4]),
        (0, 1.2 * 1024**3, [0, 0.25, 0.5, 0.75, 1, 1.25]),
    ],
)
def test_byte_axes_tick_at_binary_steps(vmin: float, vmax: float, ticks: list[float]) -> None:
    assert binary_ticks(vmin, vmax) == [t * 1024**3 for t in ticks]
    labels = [format_value(t, "bytes") for t in binary_ticks(vmin, vmax)]
    assert all(re.fullmatch(r"0 B|\d+(\.\d+)? [KMGT]iB", label) for label in labels), labels


def test_small_and_empty_byte_ranges() -> None:
    assert binary_ticks(0, 3) == [0, 1, 2, 3]
    assert binary_ticks(5, 5) == [5]


def test_report_byte_axes_use_the_binary_locator() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from kvobs.report.render import _value_axis

    fig, ax = plt.subplots()
    try:
        ax.plot([0, 1], [0, 10 * 1024**3])
        _value_axis(ax.yaxis, "bytes")
        ax.set_ylim(bottom=0)
        fig.canvas.draw()
        steps = {b - a for a, b in zip(ax.get_yticks()[:-1], ax.get_yticks()[1:], strict=True)}
        assert steps == {2 * 1024**3}
        assert [t.get_text() for t in ax.get_yticklabels()][:3] == ["0 B", "2 GiB", "4 GiB"]
    finally:
        plt.close(fig)
