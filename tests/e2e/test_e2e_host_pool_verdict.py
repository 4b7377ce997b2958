"""The host pool verdict end to end: kvobs demo -> real Prometheus -> rules and `kvobs whatif`."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from typing import Any

import pytest

from kvobs.report.prometheus_api import PrometheusClient
from tests.e2e.e2e_servers import Server, poll


def value(client: PrometheusClient, expr: str) -> float:
    series = client.query(expr)
    assert len(series) == 1, (expr, series)
    return series[0].samples[-1][1]


@pytest.fixture(scope="module")
def client(prometheus: Server) -> PrometheusClient:
    client = PrometheusClient(prometheus.url)
    # Rates over a few samples swing: wait for 20 evaluations of each rule (1 s apart).
    settled = ("min(count_over_time(instance:kvobs_host_pool_net_benefit_seconds:rate5m[1h]))"
               " > 20 and min(count_over_time(instance:kvobs_reuse_hit_ratio:rate1h[1h])) > 20")
    poll("20 evaluations of the net benefit and what-if rules",
         lambda: True if client.query(settled) else None, 120, prometheus.log, interval_s=1.0)
    return client


def test_net_benefit_is_the_modelled_saving_minus_the_measured_onload_time(client):
    # One evaluation instant for every term: the rule's inputs recomputed independently.
    at = client.query("time()")[0].samples[0][1]
    saved = client.query('sum(rate(kvobs_prefill_saved_seconds_total{tier="host"}[5m]))', at)
    onload = client.query('sum(rate(kvobs_transfer_seconds_total{src_tier="host",'
                          'dst_tier="gpu"}[5m]))', at)
    hits = client.query('sum(rate(kvobs_lookup_tokens_total{outcome="host_hit"}[5m]))', at)
    net = client.query("sum(instance:kvobs_host_pool_net_benefit_seconds:rate5m)", at)
    assert value(client, 'kvobs_prefill_cost_info{source="modelled"}') == 1
    saved_s, onload_s = saved[0].samples[0][1], onload[0].samples[0][1]
    assert saved_s == pytest.approx(hits[0].samples[0][1] / 40_000, rel=1e-6)  # demo's cost
    assert onload_s > 0
    # The rule is evaluated on its own schedule: compare with a little slack.
    assert net[0].samples[0][1] == pytest.approx(saved_s - onload_s, rel=0.25, abs=1e-3)


def test_whatif_from_prometheus_matches_the_recording_rule(client, prometheus: Server):
    rule = {s.labels["le"]: s.samples[0][1]
            for s in client.query("instance:kvobs_reuse_hit_ratio:rate1h")}
    sizes = sorted(int(le) for le in rule)
    result = subprocess.run(
        [sys.executable, "-m", "kvobs", "whatif", "--prometheus", prometheus.url,
         "--window", "1h", "--sizes", ",".join(map(str, sizes)), "--json"],
        capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    answer: dict[str, Any] = json.loads(result.stdout)
    ratios = [row["hit_ratio"] for row in answer["sizes"]]
    assert ratios == sorted(ratios) and ratios[0] >= 0 and ratios[-1] <= 1
    assert ratios[-1] > 0.3  # the chat workload reuses most blocks at 16x the capacity
    for row in answer["sizes"]:
        assert row["hit_ratio"] == pytest.approx(rule[str(row["blocks"])], abs=0.03)


def test_whatif_without_reuse_data_is_a_clear_error(bare_prometheus: Server):
    result = subprocess.run(
        [sys.executable, "-m", "kvobs", "whatif", "--prometheus", bare_prometheus.url],
        capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 2
    assert "no kvobs_reuse_* data in the last 1h" in result.stderr


def test_report_draws_the_host_pool_verdict(client, prometheus: Server, tmp_path):
    from kvobs.report.boards import dashboard_json
    from kvobs.report.fetch import data_panels
    from kvobs.report.render import PANELS_KEY, VERDICT_KEY
    from tests.e2e.test_e2e_stack import read_png

    out = tmp_path / "host-pool.png"
    result = subprocess.run(
        [sys.executable, "-m", "kvobs", "report", "--prometheus", prometheus.url,
         "--dashboard", "kvobs-host-pool", "--out", str(out), "--range", "2m",
         "--rate-interval", "15s"],
        capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    titles = [p["title"] for p in data_panels(dashboard_json("kvobs-host-pool"))]
    assert titles[:5] == ["Net benefit", "Prefill saved vs onload time",
                          "What-if: hit ratio by cache size", "Cache sizes", "Wasted offloads"]
    _, _, texts = read_png(out)
    assert json.loads(texts[PANELS_KEY]) == titles
    # the verdict in words: the demo's modelled cost is known, its onloads are timed
    (verdict,) = json.loads(texts[VERDICT_KEY])
    assert re.fullmatch(r"the host pool saves \S+ s of prefill per second for \S+ s of "
                        r"onload \(net [+-]\S+ s/s\)", verdict), verdict
    assert f"{len(titles)} panels of the kvobs-host-pool dashboard" in result.stdout
