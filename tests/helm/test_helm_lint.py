"""`helm lint --strict` on the chart with every scenario's values."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helm.helm_render import SCENARIOS, HelmChart, scenario_args, scenario_id


@pytest.mark.parametrize("force", [False, True], ids=["discovered-api", "forced-crs"])
@pytest.mark.parametrize("values", SCENARIOS, ids=scenario_id)
def test_lint_strict_passes(chart: HelmChart, values: Path | None, force: bool) -> None:
    # lint renders without cluster APIs; forcing also lints the custom resources.
    extra = ("--set", "prometheusOperator.force=true") if force else ()
    done = chart.run("lint", "--strict", str(chart.chart_dir), *scenario_args(values), *extra)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 chart(s) linted, 0 chart(s) failed" in done.stdout


def test_lint_strict_fails_on_schema_violation(chart: HelmChart) -> None:
    done = chart.run("lint", "--strict", str(chart.chart_dir), "--set", "demo.port=-1")
    assert done.returncode != 0
    assert "/demo/port" in done.stdout + done.stderr
