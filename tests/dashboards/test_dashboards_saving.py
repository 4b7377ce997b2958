"""The host pool's saving panels while the prefill cost is unknown: a gap, never 0 saved.

Issue 46: a measured cost can take minutes. Until one is known the engine's saving counter
stays at 0 (the hits are held, :mod:`kvobs.benefit`), so the panels show no value there,
then the step the first cost makes when it credits them. Checked with Prometheus's own
engine (``promtool test rules``) on known input, and a real Prometheus must accept every
query of the panels.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvobs.dashboards.promql import substitute
from kvobs.dashboards.variables import all_values
from kvobs.report.fetch import data_panels
from kvobs.report.prometheus_api import PrometheusClient
from tests.dashboards.prom_tools import find_prometheus_tool
from tests.e2e.e2e_servers import start_prometheus

PANELS = ("Net benefit", "Prefill saved vs onload time")
ONLOAD = 'src_tier="host",dst_tier="gpu"'


@pytest.fixture(scope="module")
def queries(fresh_boards: dict[str, dict[str, Any]]) -> dict[str, str]:
    """The saving panels' queries by legend, filled in as with every filter on "All"."""
    found = {}
    for panel in data_panels(fresh_boards["kvobs-host-pool"]):
        if panel["title"] in PANELS:
            for target in panel["targets"]:
                found[target["legendFormat"]] = substitute(target["expr"], all_values("1m"))
    assert set(found) == {"saves", "onload", "net", "prefill saved"}
    return found


def engine(instance: str, saved: str, onload_s: str, onload_blocks: str,
           sources: dict[str, str]) -> list[dict[str, str]]:
    """One engine process's series (promtool's expanding notation)."""
    labels = f'job="kvobs",instance="{instance}",engine="vllm",model="m"'
    series = [
        {"series": f'kvobs_prefill_saved_seconds_total{{{labels},tier="host"}}',
         "values": saved},
        {"series": f"kvobs_transfer_seconds_total{{{labels},{ONLOAD}}}", "values": onload_s},
        {"series": f"kvobs_transfer_blocks_total{{{labels},{ONLOAD}}}",
         "values": onload_blocks},
    ]
    series += [{"series": f'kvobs_prefill_cost_info{{{labels},source="{source}"}}',
                "values": values} for source, values in sources.items()]
    return series


def check(promtool: Path, tmp_path: Path, input_series: list[dict[str, str]],
          tests: list[dict[str, Any]]) -> None:
    case = {"interval": "1m", "input_series": input_series, "promql_expr_test": tests}
    test_file = tmp_path / "saving.test.yaml"
    test_file.write_text(yaml.safe_dump({"evaluation_interval": "1m", "tests": [case]}))
    result = subprocess.run([str(promtool), "test", "rules", str(test_file)],
                            capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def at(expr: str, minute: int, value: float | None) -> dict[str, Any]:
    samples = [] if value is None else [{"labels": "{}", "value": value}]
    return {"expr": expr, "eval_time": f"{minute}m", "exp_samples": samples}


def test_no_saving_until_a_cost_is_known_then_the_held_hits_in_one_step(
    queries: dict[str, str], promtool: Path, tmp_path: Path
) -> None:
    """1 s/s of prefill saved, 0.5 s/s of onload. The measured cost arrives after 10
    minutes: the counter, 0 until then, takes the 600 s held in one step, then grows."""
    series = engine("e1:9464", "0x10 600+60x20", "0+30x30", "0+60x30",
                    {"none": "1x10", "measured": "_x10 1x20"})
    saves, net, over_time = queries["saves"], queries["net"], queries["prefill saved"]
    check(promtool, tmp_path, series, [
        at(saves, 8, None), at(net, 8, None), at(over_time, 8, None),  # unknown: a gap
        at(queries["onload"], 8, 0.5),                                 # the onloads go on
        at(saves, 11, 10.0), at(net, 11, 9.5),  # the 600 held seconds, credited at once
        at(saves, 25, 1.0), at(net, 25, 0.5), at(over_time, 25, 1.0)])


def test_a_process_without_a_cost_counts_on_neither_side(
    queries: dict[str, str], promtool: Path, tmp_path: Path
) -> None:
    """e1's cost is configured; e2 has no cost (source none) and e3 no cost series at all:
    their onloads are left out of the net with their savings, not counted against e1."""
    series = [*engine("e1:9464", "0+60x30", "0+30x30", "0+60x30", {"configured": "1x30"}),
              *engine("e2:9464", "0x30", "0+60x30", "0+60x30", {"none": "1x30"}),
              *engine("e3:9464", "0x30", "0+60x30", "0+60x30", {})]
    check(promtool, tmp_path, series, [
        at(queries["saves"], 10, 1.0), at(queries["net"], 10, 0.5),
        at(queries["onload"], 10, 2.5)])  # every process's onloads, as they happen


def test_a_real_prometheus_accepts_every_saving_query(
    queries: dict[str, str], tmp_path: Path
) -> None:
    server = start_prometheus(find_prometheus_tool("prometheus"), tmp_path, [], [])
    try:
        client = PrometheusClient(server.url)
        for expr in queries.values():
            assert client.query(expr) == []
    finally:
        server.stop()
