"""The what-if panel as Grafana draws it: one curve over cache size in numeric order, and
the engine's GPU and all-tiers sizes as vertical lines on it.

Grafana's trend panel draws one query only, so the panel is an XY chart whose series map
one query's frame each. Without a Grafana server, the JSON is checked three ways: its
schema (``test_dashboards_schema``), a model of what Grafana does with it
(:mod:`tests.dashboards.grafana_xychart`, fed with the answers Prometheus gives), and its
queries run by Prometheus itself: ``promtool test rules`` on known input, and a real
Prometheus server that must accept every query.
"""

from __future__ import annotations

import itertools
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvobs.dashboards.curve import LINE_ENDS, MARKER_Y, value_column
from kvobs.dashboards.modern import GRAFANA_VERSION
from kvobs.dashboards.promql import substitute
from kvobs.dashboards.variables import all_values
from kvobs.palette import LINES, TIERS
from kvobs.report.fetch import data_panels
from kvobs.report.prometheus_api import PrometheusClient
from tests.dashboards.grafana_xychart import (
    Row,
    apply_field_config,
    drawn_series,
    shortened_names,
    table_frames,
    transform,
)
from tests.dashboards.prom_tools import find_prometheus_tool
from tests.e2e.e2e_servers import start_prometheus

TITLE = "What-if: hit ratio by cache size"
SIZES_IN_TEXT_ORDER = ["10240", "1280", "20480", "2560", "5120", "640"]
GPU_BLOCKS, CACHE_BLOCKS = 512.0, 2560.0
#: Each marker: its legend in `kvobs report`, its name in Grafana, its tier and dash.
MARKERS = [("GPU", "GPU", "gpu", "dash"), ("all tiers", "all tiers", "host", "dot")]


@pytest.fixture(scope="module")
def panel(fresh_boards: dict[str, dict[str, Any]]) -> dict[str, Any]:
    (found,) = [p for p in data_panels(fresh_boards["kvobs-host-pool"]) if p["title"] == TITLE]
    return found


def ratio(le: str) -> float:
    return round(int(le) / 20480, 4)


def answers(markers: bool = True) -> dict[str, list[Row]]:
    """Prometheus's answers to the panel's queries: the curve's rows in label text order,
    each marker its size on a y="0" and a y="1" row."""
    rows: dict[str, list[Row]] = {"A": [({"le": le}, ratio(le)) for le in SIZES_IN_TEXT_ORDER]}
    if markers:
        rows |= {ref: [({MARKER_Y: end}, size) for end in LINE_ENDS]
                 for ref, size in (("B", GPU_BLOCKS), ("C", CACHE_BLOCKS))}
    return rows


def grafana(panel: dict[str, Any], rows: dict[str, list[Row]]) -> dict[str, Any]:
    """The series Grafana draws of ``rows``, by name."""
    frames = table_frames([t["refId"] for t in panel["targets"]], rows)
    frames = transform(frames, panel["transformations"])
    apply_field_config(frames, panel["fieldConfig"])
    return {s.name: s for s in drawn_series(panel["options"], frames)}


def test_an_xy_chart_with_a_series_per_query_in_query_order(panel: dict[str, Any]) -> None:
    assert panel["type"] == "xychart"
    assert panel["pluginVersion"] == GRAFANA_VERSION  # else Grafana migrates it as pre-10.4
    refs = [t["refId"] for t in panel["targets"]]
    assert refs == ["A", "B", "C"]
    assert all(t["format"] == "table" and t["instant"] for t in panel["targets"])
    series = panel["options"]["series"]
    assert [s["frame"]["matcher"] for s in series] == [
        {"id": "byIndex", "options": i} for i in range(len(refs))]
    assert [t["legendFormat"] for t in panel["targets"]] == ["hit ratio", "GPU", "all tiers"]


def test_the_curve_is_one_line_over_cache_size_in_numeric_order(panel: dict[str, Any]) -> None:
    curve = grafana(panel, answers())["hit ratio"]
    sizes = sorted(float(le) for le in SIZES_IN_TEXT_ORDER)
    assert curve.x.name == "le" and curve.x.type == "number"
    assert curve.x.values == sizes  # the line joins its points in row order
    assert curve.y.values == [ratio(str(int(size))) for size in sizes]


def test_the_x_axis_is_cache_size_in_blocks_in_powers_of_two(panel: dict[str, Any]) -> None:
    drawn = grafana(panel, answers())
    x_axis = next(iter(drawn.values())).x.config  # Grafana sets the axis from series 1's x
    assert x_axis["unit"] == "short" and "min" not in x_axis and "max" not in x_axis
    # the series finds "le" after the overrides: older Grafana matches display names only
    assert "displayName" not in x_axis
    assert x_axis["custom"]["axisLabel"] == "cache size (blocks)"
    assert x_axis["custom"]["scaleDistribution"] == {"type": "log", "log": 2}


def test_the_sizes_are_vertical_lines_across_the_value_axis(panel: dict[str, Any]) -> None:
    drawn = grafana(panel, answers())
    assert list(drawn) == ["hit ratio", *(name for _legend, name, _t, _l in MARKERS)]
    for (_legend, name, tier, line), size in zip(MARKERS, (GPU_BLOCKS, CACHE_BLOCKS),
                                                 strict=True):
        marker = drawn[name]
        assert marker.x.values == [size, size], name
        assert sorted(marker.y.values) == [0.0, 1.0], name
        style = marker.y.config  # Grafana styles a series by its y field
        assert style["color"] == {"mode": "fixed", "fixedColor": TIERS[tier]}, name
        assert style["custom"]["show"] == "lines", name
        assert style["custom"]["lineStyle"] == LINES[line], name
        assert marker.x.config["unit"] == "short", name  # a size in blocks


def test_every_value_drawn_shares_one_0_to_1_percent_axis(panel: dict[str, Any]) -> None:
    # Grafana keys a value axis by its unit and takes its range from the fields' min/max.
    for series in grafana(panel, answers()).values():
        config = series.y.config
        assert (config["unit"], config["min"], config["max"]) == ("percentunit", 0, 1)
    assert panel["fieldConfig"]["defaults"]["custom"]["axisLabel"] == "hit ratio"


def test_the_curve_is_drawn_without_the_markers(panel: dict[str, Any]) -> None:
    drawn = grafana(panel, answers(markers=False))
    assert list(drawn) == ["hit ratio"]


def test_the_value_columns_are_found_however_grafana_names_them(panel: dict[str, Any]) -> None:
    for ref in ("A", "B", "C"):
        pattern = value_column(ref)
        assert json.dumps(pattern) in json.dumps(panel["options"]["series"])
        for name in ("Value", f"Value #{ref}"):
            assert re.fullmatch(pattern, name), (pattern, name)
        for other in ("le", MARKER_Y, "Time", *(f"Value #{r}" for r in "ABC" if r != ref)):
            assert not re.fullmatch(pattern, other), (pattern, other)


@pytest.mark.parametrize("size", [1, 2, 3])
def test_series_names_survive_grafanas_shortening(panel: dict[str, Any], size: int) -> None:
    names = [s["name"]["fixed"] for s in panel["options"]["series"]]
    for subset in itertools.combinations(names, size):
        assert shortened_names(subset) == list(subset), subset


def test_the_queries_answer_as_the_panel_expects_in_promtool(
    panel: dict[str, Any], promtool: Path, tmp_path: Path
) -> None:
    """Prometheus's engine on known input: the curve per `le` (the recording rule's own
    test figures), each marker its size on a y="0" and a y="1" row."""
    exprs = [substitute(t["expr"], all_values("1m")) for t in panel["targets"]]
    expected = [[{"labels": f'{{le="{le}"}}', "value": v} for le, v in (("1000", 0.52),
                                                                         ("2000", 0.76))],
                *([{"labels": f'{{{MARKER_Y}="{end}"}}', "value": size} for end in LINE_ENDS]
                  for size in (GPU_BLOCKS, CACHE_BLOCKS))]
    case = {"interval": "1m", "input_series": _input_series(), "promql_expr_test": [
        {"expr": expr, "eval_time": "70m", "exp_samples": samples}
        for expr, samples in zip(exprs, expected, strict=True)]}
    test_file = tmp_path / "whatif.test.yaml"
    test_file.write_text(yaml.safe_dump({"evaluation_interval": "1m", "tests": [case]}))
    result = subprocess.run([str(promtool), "test", "rules", str(test_file)],
                            capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def _input_series() -> list[dict[str, str]]:
    engine = 'job="kvobs",instance="e1:9464",engine="vllm",model="m"'
    counters = {"kvobs_reuse_references_total": "0+6000x80",
                'kvobs_reuse_sampled_references_total{le="1000"}': "0+420x80",
                'kvobs_reuse_sampled_references_total{le="2000"}': "0+600x80",
                'kvobs_reuse_sampled_references_total{le="+Inf"}': "0+780x80",
                "kvobs_reuse_sample_rate": "0.125x80",
                'kvobs_tier_capacity_blocks{tier="gpu"}': f"{GPU_BLOCKS:g}x80",
                'kvobs_tier_capacity_blocks{tier="host"}': "2048x80",
                "kvobs_reuse_capacity_blocks": f"{CACHE_BLOCKS:g}x80"}
    series = []
    for name, values in counters.items():
        metric, _, labels = name.partition("{")
        inner = f"{engine},{labels.rstrip('}')}" if labels else engine
        series.append({"series": f"{metric}{{{inner}}}", "values": values})
    return series


def test_a_real_prometheus_accepts_every_query(panel: dict[str, Any], tmp_path: Path) -> None:
    server = start_prometheus(find_prometheus_tool("prometheus"), tmp_path, [], [])
    try:
        client = PrometheusClient(server.url)
        for target in panel["targets"]:
            assert client.query(substitute(target["expr"], all_values("1m"))) == []
    finally:
        server.stop()
