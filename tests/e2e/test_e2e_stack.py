"""kvobs demo -> real Prometheus (1 s scrapes, kvobs rules loaded) -> every dashboard query.

Every panel query of every generated dashboard, with its variables filled in as Grafana
fills "All", and every recording rule expression must return finite, non-empty data
from a live demo; the figures must also agree with each other.
"""

from __future__ import annotations

import json
import math
import struct
import subprocess
import sys
import time
import urllib.parse
import urllib.request
import zlib
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvobs.dashboards import DASHBOARDS, dashboard_json
from kvobs.dashboards.promql import (
    FLEET_ONLY_METRICS,
    GPU_ONLY_METRICS,
    metric_names,
    substitute,
)
from kvobs.dashboards.variables import FILTERS, all_values
from kvobs.report.fetch import data_panels
from kvobs.report.prometheus_api import PrometheusClient, QueryFailed, Series
from kvobs.report.render import PANELS_KEY
from tests.e2e.e2e_servers import RULE_FILES, Server, poll

RATE_INTERVAL = "15s"
SETTLE_S = 60


def panel_queries(fleet: bool = False) -> list[tuple[str, str, str]]:
    """(dashboard, panel title, expr with variables filled) for every panel target: those
    an engine's exporter feeds, or with ``fleet`` those ``kvobs fleet`` feeds (checked
    where it runs, ``tests/engines/vllm032/test_fleet_serve.py``)."""
    variables = all_values(RATE_INTERVAL)
    return [(stem, panel["title"], substitute(target["expr"], variables))
            for stem in DASHBOARDS for panel in data_panels(dashboard_json(stem))
            for target in panel["targets"]
            if fleet == bool(set(metric_names(target["expr"])) & FLEET_ONLY_METRICS)]


def rules() -> list[dict[str, Any]]:
    return [rule for path in RULE_FILES
            for group in yaml.safe_load(path.read_text())["groups"] for rule in group["rules"]]


def gpu_only(expr: str) -> bool:
    return set(metric_names(expr)) <= GPU_ONLY_METRICS


def answer(client: PrometheusClient, expr: str) -> list[Series] | str:
    """Finite series of an instant query, or why there are none."""
    try:
        series = client.query(expr)
    except QueryFailed as exc:
        return f"error: {exc}"
    bad = [s for s in series if not s.finite_samples]
    if bad:
        return f"non-finite values: {bad[:3]}"
    return series if series else "empty"


@pytest.fixture(scope="module")
def client(prometheus: Server) -> PrometheusClient:
    client = PrometheusClient(prometheus.url)
    poll("the first scrape of kvobs demo (up == 1)",
         lambda: True if [s for s in client.query('up{job="kvobs"} == 1')] else None, 30,
         prometheus.log)
    return client


@pytest.fixture(scope="module")
def settled(client: PrometheusClient, prometheus: Server) -> dict[str, list[Series]]:
    """Every query that must have data, polled until all have it (offloads take seconds)."""
    expressions = {expr for _stem, _title, expr in panel_queries() if not gpu_only(expr)}
    expressions |= {rule["expr"] for rule in rules() if "record" in rule}
    expressions |= {rule["record"] for rule in rules() if "record" in rule}
    results: dict[str, list[Series] | str] = {}

    def all_answered() -> bool | None:
        for expr in expressions:
            if not isinstance(results.get(expr), list):
                results[expr] = answer(client, expr)
        return True if all(isinstance(r, list) for r in results.values()) else None

    try:
        poll("data for every panel query and recording rule", all_answered, SETTLE_S,
             prometheus.log, interval_s=1.0)
    except AssertionError:
        missing = {e: r for e, r in results.items() if not isinstance(r, list)}
        pytest.fail(f"{len(missing)} queries without finite data after {SETTLE_S}s:\n"
                    + "\n".join(f"{r}: {e}" for e, r in missing.items()))
    return {e: r for e, r in results.items() if isinstance(r, list)}


@pytest.mark.parametrize("stem,title,expr", panel_queries(),
                         ids=[f"{s}:{t}" for s, t, _e in panel_queries()])
def test_panel_query_returns_finite_data(client: PrometheusClient,
                                         settled: dict[str, list[Series]],
                                         stem: str, title: str, expr: str) -> None:
    if gpu_only(expr):  # NVML series exist only with a GPU: the query must still be valid
        result = answer(client, expr)
        assert result == "empty" or isinstance(result, list), result
        return
    series = settled[expr]
    assert series and all(math.isfinite(v) for s in series for _t, v in s.samples)


@pytest.mark.parametrize("rule", [r for r in rules() if "record" in r],
                         ids=[r["record"] for r in rules() if "record" in r])
def test_recording_rule_returns_finite_data(settled: dict[str, list[Series]],
                                            rule: dict[str, Any]) -> None:
    assert settled[rule["expr"]], rule["expr"]
    assert settled[rule["record"]], f"{rule['record']} was never recorded"


def test_alert_rules_are_loaded_and_quiet_on_a_healthy_scrape(
        client: PrometheusClient, prometheus: Server, settled: dict[str, list[Series]]) -> None:
    with urllib.request.urlopen(prometheus.url + "/api/v1/rules?type=alert", timeout=5) as r:
        groups = json.loads(r.read())["data"]["groups"]
    loaded = {rule["name"]: rule for g in groups for rule in g["rules"]}
    assert set(loaded) == {r["alert"] for r in rules() if "alert" in r}
    assert all(rule["health"] == "ok" for rule in loaded.values()), loaded
    assert loaded["KvobsTargetAbsent"]["state"] == "inactive"


def test_variable_queries_find_the_demo(prometheus: Server, settled: Any) -> None:
    for name, _label, _help in FILTERS:
        match = urllib.parse.quote("kvobs_lookups_total")
        url = f"{prometheus.url}/api/v1/label/{name}/values?match[]={match}"
        with urllib.request.urlopen(url, timeout=5) as response:
            values = json.loads(response.read())["data"]
        expected = {"namespace": [], "job": ["kvobs"]}
        if name in expected:
            assert values == expected[name], name
        else:
            assert len(values) == 1, (name, values)


def test_hit_outcomes_sum_to_all_lookup_tokens(client: PrometheusClient, settled: Any) -> None:
    # Two recording rules computed independently: per-tier hit ratios and the miss ratio.
    total = client.query(
        "sum by (instance) (instance:kvobs_lookup_hit_ratio:rate1m)"
        " + on (instance) sum by (instance) (instance:kvobs_lookup_miss_ratio:rate1m)")
    assert total and all(abs(s.samples[0][1] - 1) < 1e-9 for s in total), total
    # And the per-outcome token counters add up to the dashboard's "all tokens" figure.
    parts = client.query('sum(kvobs_lookup_tokens_total{outcome=~"gpu_hit|host_hit|disk_hit"})'
                         ' + sum(kvobs_lookup_tokens_total{outcome="miss"})')
    whole = client.query("sum(kvobs_lookup_tokens_total)")
    assert parts[0].samples[0][1] == whole[0].samples[0][1] > 0


def test_miss_causes_add_up_to_the_missed_tokens_in_every_scrape(client: PrometheusClient,
                                                                 settled: Any) -> None:
    """kvobs demo's missed tokens, by cause, at every scrape Prometheus holds: the causes
    sum to the misses, and the demo's churn shows prompts never seen and evicted ones."""
    now = time.time()
    gaps = client.query_range('sum by (instance) (kvobs_miss_tokens_total)'
                              ' - on (instance) sum by (instance) '
                              '(kvobs_lookup_tokens_total{outcome="miss"})',
                              now - 120, now, 1.0)
    assert gaps and all(v == 0 for s in gaps for _t, v in s.samples), gaps
    causes = {s.labels["cause"]: s.samples[0][1]
              for s in client.query("sum by (cause) (kvobs_miss_tokens_total)")}
    assert causes["cold"] > 0 and causes["evicted"] > 0 and causes["unknown"] == 0, causes


@pytest.mark.parametrize("unit", ["blocks", "bytes"])
def test_resident_never_exceeds_capacity(client: PrometheusClient, settled: Any,
                                         unit: str) -> None:
    excess = client.query(
        f"max_over_time((sum by (instance, tier) (kvobs_tier_resident_{unit})"
        f" - on (instance, tier) kvobs_tier_capacity_{unit})[5m:1s])")
    assert {s.labels["tier"] for s in excess} == {"gpu", "host"}
    for series in excess:
        assert series.samples[0][1] <= 0, series


def read_png(path: Path) -> tuple[int, int, dict[str, str]]:
    """Width, height and text chunks of a PNG; fails on a broken file (CRCs checked)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, texts, size = 8, {}, (0, 0)
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        crc = struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])[0]
        assert zlib.crc32(kind + body) == crc, f"bad CRC in {kind!r}"
        if kind == b"IHDR":
            size = struct.unpack(">II", body[:8])
        elif kind == b"tEXt":
            key, _, value = body.partition(b"\0")
            texts[key.decode("latin-1")] = value.decode("latin-1")
        pos += 12 + length
        if kind == b"IEND":
            break
    return size[0], size[1], texts


def test_report_draws_one_plot_per_tiers_panel(prometheus: Server, settled: Any,
                                               tmp_path: Path) -> None:
    out = tmp_path / "tiers.png"
    result = subprocess.run(
        [sys.executable, "-c", "import sys; from kvobs.cli import main; sys.exit(main())",
         "report", "--prometheus", prometheus.url, "--out", str(out), "--range", "2m",
         "--rate-interval", RATE_INTERVAL],
        capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    width, height, texts = read_png(out)
    titles = [p["title"] for p in data_panels(dashboard_json("kvobs-tiers"))]
    assert json.loads(texts[PANELS_KEY]) == titles
    rows = math.ceil(len(titles) / 2)
    assert (width, height) == ((17 * 90), round(3.9 * rows * 90))
    assert f"{len(titles)} panels" in result.stdout
    assert [p.name for p in tmp_path.iterdir()] == ["tiers.png"]
