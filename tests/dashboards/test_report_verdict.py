"""The host pool verdict as `kvobs report` draws it: the what-if as one curve in numeric
order with the engine's sizes marked, the verdict in words, and an unknown net benefit
shown as unknown. Panels come from the generated host-pool dashboard itself; the series
are what Prometheus would answer (label values in its text order)."""

from __future__ import annotations

from typing import Any

import matplotlib.pyplot as plt
import pytest

from kvobs.report.boards import dashboard_json
from kvobs.report.fetch import PanelData, data_panels, fetch_panels
from kvobs.report.prometheus_api import Series
from kvobs.report.render import _draw_panel, verdicts

SIZES_IN_TEXT_ORDER = ["10240", "122880", "1280", "20480", "2560", "40960", "5120", "640",
                       "81920"]
HIT_RATIO = {int(le): min(1.0, 0.1 + 0.1 * i) for i, le in
             enumerate(sorted(SIZES_IN_TEXT_ORDER, key=int))}


class Answers:
    """Prometheus's answers to the host-pool dashboard's queries, by what they ask for
    (``saves`` None: no prefill cost is known, so the saving and the net have no value)."""

    def __init__(self, net: float | None, saves: float | None = 0.13) -> None:
        self.net, self.saves = net, saves

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[Series]:
        def one(value: float, **labels: str) -> Series:
            return Series(labels, [(end, value)])

        flat = " ".join(expr.split())
        if "kvobs_reuse_sampled_references_total" in flat:
            return [one(HIT_RATIO[int(le)], le=le) for le in SIZES_IN_TEXT_ORDER]
        saving = flat.startswith("sum(rate(kvobs_prefill_saved_seconds_total")
        if saving:  # the saving, and the net benefit: where a prefill cost is known
            assert 'kvobs_prefill_cost_info{' in flat and 'source!="none"' in flat
        if saving and "kvobs_transfer_seconds_total" in flat:  # the net benefit
            return [] if self.net is None or self.saves is None else [one(self.net)]
        if saving:
            return [] if self.saves is None else [one(self.saves)]
        if flat.startswith("sum(rate(kvobs_transfer_seconds_total"):
            return [one(0.004)]
        if "kvobs_tier_capacity_blocks" in flat and "kvobs_tier_resident" not in flat:
            return [one(2048)]
        if "kvobs_reuse_capacity_blocks" in flat:
            return [one(10240)]
        return [one(0.5)]


def panels(net: float | None, saves: float | None = 0.13) -> dict[str, PanelData]:
    board = dashboard_json("kvobs-host-pool")
    fetched = fetch_panels(Answers(net, saves), board, {}, 0.0, 60.0,  # type: ignore[arg-type]
                           15.0)
    return {p.title: p for p in fetched}


def test_the_whatif_is_one_curve_in_numeric_order_with_the_sizes_marked() -> None:
    panel = panels(0.126)["What-if: hit ratio by cache size"]
    assert panel.kind == "xychart" and panel.x_field == "le"
    fig, ax = plt.subplots()
    try:
        _draw_panel(ax, panel)
        curve, *markers = ax.get_lines()
        xs = list(curve.get_xdata())
        assert xs == sorted(int(le) for le in SIZES_IN_TEXT_ORDER)  # one line, in order
        assert list(curve.get_ydata()) == [HIT_RATIO[int(x)] for x in xs]
        assert ax.get_xscale() == "log"
        assert [(m.get_label(), m.get_xdata()[0]) for m in markers] == [
            ("GPU: 2,048 blocks", 2048), ("all tiers: 10,240 blocks", 10240)]
        assert ax.get_xlabel() == "cache size (blocks)"
    finally:
        plt.close(fig)


def test_the_verdict_is_said_in_words() -> None:
    got = verdicts(list(panels(0.126).values()))
    assert got == ["the host pool saves 0.13 s of prefill per second for 0.004 s of onload "
                   "(net +0.126 s/s)"]


def test_an_unknown_net_benefit_is_unknown_not_an_error_nor_a_number() -> None:
    verdict = panels(None)["Net benefit"]
    assert [t.legend_format for t in verdict.targets] == ["saves", "onload"]
    assert verdict.notes == ["net: unknown (no prefill cost known, or onloads without seconds)"]
    assert verdicts([verdict]) == [
        "the host pool's net benefit is unknown (onloads the engine does not time): 0.13 s "
        "of prefill saved per second, 0.004 s of onload"]


def test_an_unknown_prefill_cost_is_unknown_with_what_to_do_never_0_saved() -> None:
    """Issue 46: the first minutes of a measured cost. The saving has no value (a gap),
    and the verdict says how to get one."""
    got = panels(None, saves=None)
    verdict, over_time = got["Net benefit"], got["Prefill saved vs onload time"]
    assert [t.legend_format for t in verdict.targets] == ["onload"]
    assert verdict.notes == ["saves: unknown (no prefill cost known yet)",
                             "net: unknown (no prefill cost known, or onloads without seconds)"]
    assert [t.legend_format for t in over_time.targets] == ["onload"]  # no line at 0
    assert over_time.notes == ["prefill saved: unknown (no prefill cost known yet)"]
    assert verdicts(list(got.values())) == [
        "the host pool's net benefit is unknown: no prefill cost is known yet (set "
        "KVOBS_PREFILL_SECONDS_PER_TOKEN to the engine's prefill seconds per prompt token, "
        "or wait for the measured cost); 0.004 s of onload per second"]
    assert "KVOBS_PREFILL_SECONDS_PER_TOKEN" in over_time.description


@pytest.mark.parametrize(("title", "unit"), [
    ("Net benefit", "s/s"), ("Prefill saved vs onload time", "s/s"),
    ("What-if: hit ratio by cache size", "percentunit"), ("Re-onload (thrash) rate", "short"),
    ("Thrash share of onloads", "percentunit")])
def test_each_verdict_panel_has_its_own_unit_and_axis(title: str, unit: str) -> None:
    board: Any = {p["title"]: p for p in data_panels(dashboard_json("kvobs-host-pool"))}
    assert board[title]["fieldConfig"]["defaults"]["unit"] == unit
