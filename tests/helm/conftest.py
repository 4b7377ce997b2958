"""Fixtures for the helm/kvobs tests: the real helm binary and the chart with its files."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import required
from tests.helm.helm_render import CHART_DIR, HelmChart, find_tool


@pytest.fixture(scope="session")
def helm() -> Path:
    return find_tool("helm")


@pytest.fixture(scope="session")
def generated_files() -> dict[str, list[Path]]:
    """The dashboards and rules `kvobs dashboards` copies into the chart.

    Missing copies skip the tests locally and fail them in CI: the chart must not ship
    without them.
    """
    files = {
        "dashboards": sorted((CHART_DIR / "files" / "dashboards").glob("*.json")),
        "rules": sorted((CHART_DIR / "files" / "rules").glob("*.rules.yaml")),
    }
    missing = [kind for kind, paths in files.items() if not paths]
    if missing:
        required.missing(f"{CHART_DIR}/files has no {' or '.join(missing)}; run `kvobs dashboards`")
    return files


@pytest.fixture(scope="session")
def chart(helm: Path, generated_files: dict[str, list[Path]]) -> HelmChart:
    return HelmChart(helm, CHART_DIR)
