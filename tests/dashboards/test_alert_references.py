"""Every dashboard, panel and row an alert's annotations name in quotes exists in the
dashboards kvobs ships: a runbook must not send anyone to a panel that is not there."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.dashboards.prom_tools import REPO
from tests.dashboards.test_dashboards_rules import rules

#: A quoted name: opened by a quote no letter precedes, closed by one no letter follows
#: (``pool's`` is an apostrophe, not a quote).
QUOTED = re.compile(r"(?<![A-Za-z])'([^']+)'(?![A-Za-z])")
#: An alert template's label (``{{ $labels.tier }}``) is the dashboard's variable (``$tier``).
LABEL = re.compile(r"\{\{\s*\$labels\.(\w+)\s*\}\}")


def titles(panels: list[dict[str, Any]]) -> set[str]:
    """Titles of these panels and rows, and of the panels inside collapsed rows."""
    found = set()
    for panel in panels:
        found.add(panel.get("title", ""))
        found |= titles(panel.get("panels", []))
    return found


def shipped_boards(repo: Path) -> dict[str, set[str]]:
    """Each generated dashboard's title, as annotations name it (without ``kvobs / ``),
    -> the titles of its panels and rows."""
    boards = {}
    for path in sorted((repo / "dashboards" / "generated").glob("*.json")):
        board = json.loads(path.read_text())
        boards[board["title"].removeprefix("kvobs / ")] = titles(board["panels"])
    return boards


def references(text: str, boards: dict[str, set[str]]) -> list[str]:
    """The quoted names in ``text`` that are no dashboard and no panel or row of the
    dashboard named last before them (of any dashboard, before the first is named)."""
    wrong = []
    current: str | None = None
    for match in QUOTED.finditer(text):
        name = LABEL.sub(r"$\1", match.group(1))
        if name in boards:
            current = name
            continue
        where = [current] if current else list(boards)
        if not any(name in boards[board] for board in where):
            wrong.append(f"'{name}' (no such panel on {' or '.join(map(repr, where))})")
    return wrong


def test_the_reference_check_catches_a_missing_panel(repo: Path) -> None:
    boards = shipped_boards(repo)
    assert references("Check: 'KV cache tiers' dashboard, panels 'Resident occupancy per "
                      "tier' and 'Evictions per tier and reason'.", boards) == [
        "'Resident occupancy per tier' (no such panel on 'KV cache tiers')"]
    # a panel of another dashboard is wrong too, and so is a dashboard that does not exist
    assert references("'Host pool health' dashboard, panel 'Drops and failures'", boards)
    assert references("'KV tiers' dashboard", boards)


@pytest.mark.parametrize("rule", [r for r in rules(REPO)
                                  if "alert" in r], ids=lambda r: r["alert"])
def test_alert_annotations_name_dashboards_and_panels_that_exist(rule: dict[str, Any],
                                                                 repo: Path) -> None:
    boards = shipped_boards(repo)
    wrong = [problem for text in rule["annotations"].values()
             for problem in references(text, boards)]
    assert not wrong, f"{rule['alert']} names {', '.join(wrong)}"


def test_the_tier_full_alert_points_at_the_occupancy_panel(repo: Path) -> None:
    (rule,) = [r for r in rules(repo) if r.get("alert") == "KvobsTierFullWithEvictions"]
    names = QUOTED.findall(rule["annotations"]["description"])
    assert "Resident occupancy of {{ $labels.tier }} (in use vs cached)" in names
