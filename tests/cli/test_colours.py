"""One colour per tier, outcome and direction: the report, the dashboards and kvobs top agree."""

import re

import pytest

from kvobs.report.boards import dashboard_json, dashboard_stems
from kvobs.report.fetch import PanelData, TargetData, data_panels
from kvobs.report.palette import DIRECTIONS, OUTCOMES, TIERS, series_color
from kvobs.report.prometheus_api import Series


def overrides(board):
    for panel in data_panels(board):
        for override in panel.get("fieldConfig", {}).get("overrides", []):
            props = {p["id"]: p["value"] for p in override["properties"]}
            if "color" in props:
                yield panel, override["matcher"]["options"], props


def test_palette_colours_are_distinct_within_each_kind():
    for kind in (TIERS, DIRECTIONS, OUTCOMES):
        assert len(set(kind.values())) == len(kind)
    assert OUTCOMES["gpu_hit"] == TIERS["gpu"] and OUTCOMES["host_hit"] == TIERS["host"]


@pytest.mark.parametrize("stem", dashboard_stems())
def test_dashboard_overrides_are_the_palette(stem):
    board = dashboard_json(stem)
    for panel, name, props in overrides(board):
        color = props["color"]["fixedColor"]
        direction = re.search(r"(\w+) → (\w+)", name)
        if direction:
            assert color == DIRECTIONS[direction.groups()], (panel["title"], name)
        elif name in OUTCOMES:
            assert color == OUTCOMES[name], (panel["title"], name)
        else:
            tier, _, rest = name.partition(" ")
            expected = series_color({"tier": tier, "state": rest} if rest in ("in_use", "cached")
                                    else {"tier": tier})
            assert color == expected, (panel["title"], name)


def test_tiers_dashboard_colours_every_tier_outcome_and_direction_panel():
    coloured = {panel["title"] for panel, _n, _p in overrides(dashboard_json("kvobs-tiers"))}
    for title in ("Capacity per tier (tokens)", "Resident occupancy per tier (in use vs cached)",
                  "Lookup tokens by outcome", "Transfer throughput per direction vs link peak",
                  "Transfer latency p50 / p99", "Drops and failures"):
        assert title in coloured, title
    # an eviction reason is not a tier: those lines keep distinct colours
    assert "Evictions per tier and reason" not in coloured


def test_report_draws_series_in_the_palette_colours():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_hex

    from kvobs.report.render import _draw_timeseries

    samples = [(1.0, 1.0), (2.0, 2.0)]
    panel = PanelData("Transfer latency p50 / p99", "timeseries", "s", "", [
        TargetData("p50 {{src_tier}} → {{dst_tier}}", "q1",
                   [Series({"src_tier": "gpu", "dst_tier": "host"}, samples)]),
        TargetData("p99 {{src_tier}} → {{dst_tier}}", "q2",
                   [Series({"src_tier": "gpu", "dst_tier": "host"}, samples)]),
        TargetData("{{tier}} {{reason}}", "q3",
                   [Series({"tier": "gpu", "reason": "explicit"}, samples)]),
    ])
    fig, ax = plt.subplots()
    try:
        _draw_timeseries(ax, panel, stacked=False)
        lines = {line.get_label(): line for line in ax.get_lines()}
    finally:
        plt.close(fig)
    offload = DIRECTIONS[("gpu", "host")].lower()
    assert to_hex(lines["p50 gpu → host"].get_color()) == offload
    assert to_hex(lines["p99 gpu → host"].get_color()) == offload
    assert lines["p99 gpu → host"].get_linestyle() == "--"
    assert to_hex(lines["gpu explicit"].get_color()) != TIERS["gpu"].lower()  # not a tier line
