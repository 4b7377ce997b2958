"""Fixtures for the dashboard and rule tests: the generated files and promtool."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kvobs.dashboards import DASHBOARDS, dashboard_json
from tests.dashboards.prom_tools import REPO, find_prometheus_tool


@pytest.fixture(scope="session")
def promtool() -> Path:
    return find_prometheus_tool("promtool")


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.fixture(scope="session", params=sorted(DASHBOARDS))
def board(request: pytest.FixtureRequest) -> dict[str, Any]:
    """Each dashboard as the committed JSON file (what users import)."""
    path = REPO / "dashboards" / "generated" / f"{request.param}.json"
    loaded: dict[str, Any] = json.loads(path.read_text())
    return loaded


@pytest.fixture(scope="session")
def fresh_boards() -> dict[str, dict[str, Any]]:
    """Each dashboard as the sources generate it now."""
    return {stem: dashboard_json(stem) for stem in DASHBOARDS}
