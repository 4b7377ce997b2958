"""The committed dashboards and rules are exactly what the sources generate, and read well."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from kvobs.cli import main
from kvobs.dashboards import DASHBOARDS, RULE_FILES, drift, render
from kvobs.dashboards.promql import problems
from kvobs.dashboards.recording_rules import recorded_names
from kvobs.dashboards.variables import FILTERS, REPEATS
from kvobs.report.fetch import data_panels

STABLE_DASHBOARDS = {"kvobs-tiers", "kvobs-host-pool", "kvobs-fleet", "kvobs-fleet-cache"}
STABLE_RULES = {"kvobs-recording.rules.yaml", "kvobs-alerts.rules.yaml"}


def queries(board: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, expr) of every target of every panel."""
    return [(p["title"], t["expr"]) for p in data_panels(board) for t in p.get("targets", [])]


def test_committed_files_match_sources(repo: Path) -> None:
    stale = drift(repo)
    assert not stale, f"stale generated files {stale}: run `kvobs dashboards` and commit"


def test_chart_copies_are_identical(repo: Path) -> None:
    files = render()
    for stem in STABLE_DASHBOARDS:
        assert (
            files[f"dashboards/generated/{stem}.json"]
            == files[f"helm/kvobs/files/dashboards/{stem}.json"]
        )
    for name in STABLE_RULES:
        original = (repo / "dashboards" / "rules" / name).read_bytes()
        assert (repo / "helm" / "kvobs" / "files" / "rules" / name).read_bytes() == original


def test_file_names_are_stable() -> None:
    assert set(DASHBOARDS) == STABLE_DASHBOARDS
    assert set(RULE_FILES) == STABLE_RULES


def test_cli_check_fails_on_drift_and_write_repairs_it(
    repo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "helm").mkdir()
    shutil.copytree(repo / "dashboards" / "generated", tmp_path / "dashboards" / "generated")
    shutil.copytree(repo / "dashboards" / "rules", tmp_path / "dashboards" / "rules")
    edited = tmp_path / "dashboards" / "generated" / "kvobs-tiers.json"
    edited.write_text(edited.read_text().replace("KV cache tiers", "hand edited"))

    assert main(["dashboards", "--root", str(tmp_path), "--check"]) == 1
    err = capsys.readouterr().err
    assert "stale: dashboards/generated/kvobs-tiers.json" in err
    assert "stale: helm/kvobs/files/dashboards/kvobs-tiers.json" in err  # copy missing
    assert "stale: dashboards/generated/kvobs-host-pool.json" not in err

    assert main(["dashboards", "--root", str(tmp_path)]) == 0
    assert "wrote dashboards/generated/kvobs-tiers.json" in capsys.readouterr().out
    assert main(["dashboards", "--root", str(tmp_path), "--check"]) == 0
    assert drift(tmp_path) == []


def test_cli_refuses_a_root_without_dashboards(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["dashboards", "--root", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvobs: error: --root") and "dashboards/" in err
    assert not any(tmp_path.iterdir())


def test_every_query_names_only_catalog_metrics(board: dict[str, Any]) -> None:
    found = [
        f"{title!r}: {p}"
        for title, expr in queries(board)
        for p in problems(expr, recorded_names())
    ]
    assert not found, "\n".join(found)


def test_a_query_on_an_unknown_metric_is_caught(board: dict[str, Any]) -> None:
    title, expr = queries(board)[0]
    renamed = re.sub(r"kvobs_\w+", "kvobs_renamed_metric", expr, count=1)
    assert problems(renamed) == [
        "names 'kvobs_renamed_metric', which is not in kvobs.catalog.METRICS"
    ], title


def test_every_panel_has_a_unit_and_a_description(board: dict[str, Any]) -> None:
    for panel in data_panels(board):
        assert len(panel.get("description", "")) > 40, panel["title"]
        assert panel["fieldConfig"]["defaults"].get("unit"), panel["title"]
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["targets"], panel["title"]


def test_variables_filter_every_query(board: dict[str, Any]) -> None:
    names = [v["name"] for v in board["templating"]["list"]]
    repeated = sorted({p["repeat"] for p in data_panels(board) if p.get("repeat")})
    assert names == ["datasource", *(name for name, _l, _h in FILTERS), *repeated]
    assert set(repeated) <= {name for name, _l, _h, _m in REPEATS}
    for variable in board["templating"]["list"]:
        assert variable.get("description"), variable["name"]
    for title, expr in queries(board):
        for name, _label, _help in FILTERS:
            assert f'{name}=~"${name}"' in expr, f"{title!r} ignores ${name}: {expr}"


def test_layout_has_no_overlaps(board: dict[str, Any]) -> None:
    cells: set[tuple[int, int]] = set()
    for panel in board["panels"]:
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= 24, panel["title"]
        for x in range(pos["x"], pos["x"] + pos["w"]):
            for y in range(pos["y"], pos["y"] + pos["h"]):
                assert (x, y) not in cells, f"{panel['title']!r} overlaps at {(x, y)}"
                cells.add((x, y))
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize(
    "stem,sections",
    [
        (
            "kvobs-tiers",
            [
                "capacity per tier (tokens)",
                "capacity per tier (bytes)",
                "resident occupancy",
                "lookup tokens by outcome",
                "link peak",
                "p50 / p99",
                "heatmap",
                "thrash",
                "drops and failures",
            ],
        ),
        (
            "kvobs-host-pool",
            [
                "host occupancy",
                "evictions",
                "reused vs evicted unused",
                "thrash",
                "onload latency",
                "bytes per host hit",
            ],
        ),
        ("kvobs-fleet", ["per instance", "per model"]),
    ],
)
def test_dashboards_cover_the_issue(
    fresh_boards: dict[str, dict[str, Any]], stem: str, sections: list[str]
) -> None:
    titles = " | ".join(p["title"].lower() for p in data_panels(fresh_boards[stem]))
    for words in sections:
        assert words in titles, f"{stem} has no panel about {words!r}: {titles}"
