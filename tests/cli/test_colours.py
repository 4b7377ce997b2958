"""One colour per tier, outcome and direction: the report, the dashboards and kvobs top agree.

The rules of issue 21 ("Pictures"): every panel that splits by tier gives each tier its
palette colour (states and eviction reasons as shades and dashes of it), occupancy is
stacked per tier, byte axes are IEC, and ``kvobs report`` draws what the overrides say.
"""

import re

import pytest

from kvobs.palette import (
    BROKEN_LINE_WIDTH,
    DIRECTIONS,
    LINES,
    OTHERS,
    OUTCOMES,
    REASONS,
    SHADES,
    TIERS,
    legend_styles,
    series_color,
)
from kvobs.report.boards import dashboard_json, dashboard_stems
from kvobs.report.fetch import PanelData, TargetData, data_panels, is_stacked, series_overrides
from kvobs.report.prometheus_api import Series

BOARDS = {stem: dashboard_json(stem) for stem in dashboard_stems()}


def panel(stem, title):
    (found,) = [p for p in data_panels(BOARDS[stem]) if p["title"] == title]
    return found


def legends(p):
    return [t.get("legendFormat", "") for t in p.get("targets", [])]


def test_palette_colours_are_distinct_within_each_kind():
    for kind in (TIERS, DIRECTIONS, OUTCOMES):
        assert len(set(kind.values())) == len(kind)
    assert OUTCOMES["gpu_hit"] == TIERS["gpu"] and OUTCOMES["host_hit"] == TIERS["host"]
    shades = [c for tier in SHADES.values() for c in tier.values()]
    assert len(set(shades)) == len(shades)  # no tier's shade is another tier's
    assert set(TIERS) >= {"gpu", "host", "disk", "remote"}
    assert not set(OTHERS) & (set(shades) | set(DIRECTIONS.values()) | set(OUTCOMES.values()))


def test_the_palette_is_one_module_that_report_and_top_share():
    import kvobs.palette
    import kvobs.report.palette
    import kvobs.top.render

    assert kvobs.report.palette.TIERS is kvobs.palette.TIERS
    assert kvobs.top.render.tier_color is kvobs.palette.tier_color


def test_top_and_the_dashboards_import_no_report():
    import subprocess
    import sys

    code = ("import sys, kvobs.top.render, kvobs.dashboards.panels; "
            "print(sorted(m for m in sys.modules if m.startswith(('kvobs.report', 'matplotlib'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("stem", sorted(BOARDS))
def test_dashboard_overrides_are_exactly_the_palette(stem):
    for p in data_panels(BOARDS[stem]):
        expected = {}
        for legend in legends(p):
            expected |= legend_styles(legend)
        # series colours only: a trend panel's x field ("le") has an axis override
        found = {n: o for n, o in series_overrides(p).items() if "color" in o}
        names = [o["matcher"]["options"] for o in p["fieldConfig"]["overrides"]]
        assert len(names) == len(set(names)), p["title"]
        assert set(found) == set(expected), p["title"]
        for name, style in expected.items():
            assert found[name]["color"] == {"mode": "fixed", "fixedColor": style.color}
            if p["type"] == "timeseries" and style.line != "solid":
                assert found[name]["custom.lineStyle"] == LINES[style.line], (p["title"], name)
                assert found[name]["custom.lineWidth"] == BROKEN_LINE_WIDTH, (p["title"], name)


@pytest.mark.parametrize("stem", sorted(BOARDS))
def test_every_panel_split_by_tier_gives_each_tier_its_colour(stem):
    split = [p for p in data_panels(BOARDS[stem])
             if any("{{tier}}" in legend for legend in legends(p))]
    assert split or stem == "kvobs-fleet" or stem == "kvobs-host-pool"
    for p in split:
        found = series_overrides(p)
        for tier, shades in SHADES.items():
            mine = {n: o for n, o in found.items() if n.split(" ")[0] == tier}
            assert mine, (p["title"], tier)
            assert {o["color"]["fixedColor"] for o in mine.values()} <= set(shades.values())


def test_evictions_are_tier_hues_with_reason_shades_and_dashes():
    found = series_overrides(panel("kvobs-tiers", "Evictions per tier and reason"))
    looks = {}
    for name, props in found.items():
        tier, reason = name.split(" ")
        shade, line = REASONS[reason]
        assert props["color"]["fixedColor"] == SHADES[tier][shade], name
        assert props.get("custom.lineStyle", LINES["solid"]) == LINES[line], name
        looks[name] = (props["color"]["fixedColor"], str(props.get("custom.lineStyle")))
    assert len(set(looks.values())) == len(looks) == len(SHADES) * len(REASONS)
    # the pairs the issue found indistinguishable with Grafana's stock colours
    assert looks["gpu capacity"][0] != looks["host other"][0]
    assert looks["host capacity"][0] != looks["gpu reset"][0]
    assert series_color({"tier": "gpu", "reason": "capacity"}) == TIERS["gpu"]


@pytest.mark.parametrize("stem,title", [
    ("kvobs-tiers", "Resident occupancy of $tier (in use vs cached)"),
    ("kvobs-tiers", "Resident bytes of $tier"),
    ("kvobs-host-pool", "Host occupancy"),
])
def test_occupancy_stacks_each_tier_by_state(stem, title):
    p = panel(stem, title)
    assert is_stacked(p)
    found = series_overrides(p)
    for tier in SHADES:
        for state in ("in_use", "cached"):
            assert found[f"{tier} {state}"]["custom.stacking"] == {"mode": "normal",
                                                                  "group": tier}
        if f"{tier} capacity" in found:  # a reference line, never part of the stack
            assert found[f"{tier} capacity"]["custom.stacking"]["mode"] == "none"
            assert found[f"{tier} capacity"]["custom.lineStyle"] == LINES["dash"]


@pytest.mark.parametrize("title", ["Resident occupancy of $tier (in use vs cached)",
                                   "Resident bytes of $tier"])
def test_occupancy_repeats_per_tier_in_use_below_cached(title):
    p = panel("kvobs-tiers", title)
    assert (p["repeat"], p["repeatDirection"], p["gridPos"]["w"]) == ("tier", "h", 24)
    exprs = [t["expr"] for t in p["targets"]]
    assert 'state="in_use"' in exprs[0] and 'state="cached"' in exprs[1]  # stacking order
    assert all('tier=~"$tier"' in e for e in exprs)


def test_report_draws_a_repeated_panel_once_per_tier(tmp_path, monkeypatch):
    from kvobs.report.render import render_png

    p = panel("kvobs-tiers", "Resident occupancy of $tier (in use vs cached)")
    at = [(1.0, 0.25), (2.0, 0.5)]
    data = PanelData(p["title"], "timeseries", "percentunit", "", [
        TargetData(t["legendFormat"], t["expr"], [
            Series({"tier": tier, "state": state}, at) for tier in ("host", "gpu")])
        for t, state in zip(p["targets"], ("in_use", "cached"), strict=True)],
        overrides=series_overrides(p), stacked=is_stacked(p), repeat=p["repeat"])
    import matplotlib.pyplot as plt

    shown = []
    real = plt.close

    def keep(fig=None):  # look at the figure before render_png closes it
        shown.extend(fig.axes[0].child_axes)
        real(fig)

    monkeypatch.setattr(plt, "close", keep)
    render_png([data], tmp_path / "r.png", "t", "s")
    assert [a.get_title(loc="left") for a in shown] == ["gpu", "host"]
    for axis, tier in zip(shown, ("gpu", "host"), strict=True):
        assert {t.get_text() for t in axis.get_legend().get_texts()} == {
            f"{tier} in_use", f"{tier} cached"}


@pytest.mark.parametrize("stem", sorted(BOARDS))
def test_byte_panels_use_the_iec_unit(stem):
    assert '"decbytes"' not in str(BOARDS[stem]).replace("'", '"')
    for p in data_panels(BOARDS[stem]):
        exprs = " ".join(t["expr"] for t in p["targets"])
        if re.search(r"kvobs_\w+_bytes\b(?!_)", exprs) and "rate(" not in exprs:
            assert p["fieldConfig"]["defaults"]["unit"] == "bytes", p["title"]


def _draw(p, series_per_target):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from kvobs.report.render import _draw_timeseries

    data = PanelData(p["title"], "timeseries", p["fieldConfig"]["defaults"]["unit"], "", [
        TargetData(legend, f"q{i}", series)
        for i, (legend, series) in enumerate(zip(legends(p), series_per_target, strict=True))],
        overrides=series_overrides(p),
        stacked=is_stacked(p))
    fig, ax = plt.subplots()
    _draw_timeseries(ax, data)
    fig.canvas.draw()
    return fig, ax


def test_report_draws_evictions_in_the_dashboards_shades_and_dashes():
    from matplotlib.colors import to_hex

    samples = [(1.0, 1.0), (2.0, 2.0)]
    p = panel("kvobs-tiers", "Evictions per tier and reason")
    fig, ax = _draw(p, [[Series({"tier": tier, "reason": reason}, samples)
                         for tier in ("gpu", "host") for reason in REASONS]])
    try:
        lines = {line.get_label(): line for line in ax.get_lines()}
        found = series_overrides(p)
        for name, line in lines.items():
            assert to_hex(line.get_color()) == found[name]["color"]["fixedColor"].lower()
        looks = {(to_hex(ln.get_color()), str(ln.get_linestyle())) for ln in lines.values()}
        assert len(looks) == len(lines) == 8
        assert lines["gpu capacity"].get_linestyle() == "-"
        assert lines["host explicit"].get_linestyle() != "-"
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)


def test_report_stacks_occupancy_per_tier_under_a_dashed_capacity():
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.colors import to_hex

    p = panel("kvobs-tiers", "Resident bytes of $tier")
    at = [(1.0, 0.0), (2.0, 0.0)]

    def s(tier, value, state=None):
        labels = {"tier": tier} | ({"state": state} if state else {})
        return Series(labels, [(t, value) for t, _ in at])

    fig, ax = _draw(p, [[s("gpu", 2.0, "in_use"), s("host", 7.0, "in_use")],
                        [s("gpu", 3.0, "cached"), s("host", 1.0, "cached")],
                        [s("gpu", 8.0), s("host", 16.0)]])
    try:
        tops = {}
        for line in ax.get_lines():
            tops.setdefault(to_hex(line.get_color()), []).append(
                (float(np.max(line.get_ydata())), line.get_linestyle()))
        gpu, host = SHADES["gpu"], SHADES["host"]
        assert (2.0, "-") in tops[gpu["base"].lower()]  # in_use at the bottom
        assert (5.0, "-") in tops[gpu["light"].lower()]  # cached stacked on in_use
        assert (8.0, "-") in tops[host["light"].lower()]  # per tier: not on top of gpu
        capacity = [ln for ln in ax.get_lines() if ln.get_linestyle() != "-"]
        assert sorted(float(np.max(ln.get_ydata())) for ln in capacity) == [8.0, 16.0]
        assert len(ax.collections) == 4  # one filled area per tier and state
    finally:
        plt.close(fig)
