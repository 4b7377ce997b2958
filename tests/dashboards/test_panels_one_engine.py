"""An engine counts once on the dashboards, however many processes it scrapes as.

Two engines of one model, the way real scrapes show them: an SGLang engine with tensor
parallelism 2 (one scheduler process per rank, each its own endpoint, each seeing the whole
batch's lookups) and a vLLM engine whose GPU worker serves its opt-in endpoint
(``KVOBS_WORKER_METRICS=1``: no tiers, no lookups). The panels that count engines or add
up lookups are evaluated by promtool, as recording rules over these series, with the
variables filled as Grafana fills "All": each engine must count once.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml

from kvobs.dashboards import dashboard_json
from kvobs.dashboards.promql import substitute
from kvobs.dashboards.variables import all_values
from kvobs.report.fetch import data_panels

MINUTES = 10
#: Lookups a minute of each engine (SGLang: each rank sees all of them).
SGLANG_LOOKUPS, VLLM_LOOKUPS = 120, 60
SGLANG_TOKENS, VLLM_TOKENS = 2400, 600  # missed tokens a minute
SGLANG_HOST_TOKENS, SHARD_BYTES = 120, 6000  # SGLang's host hits; each rank onloads its shard


def process(instance: str, engine: str, **labels: str) -> str:
    extra = "".join(f',{k}="{v}"' for k, v in labels.items())
    return f'job="kvobs",instance="{instance}",engine="{engine}",model="m"{extra}'


def counter(name: str, labels: str, per_minute: int) -> dict[str, str]:
    return {"series": f"{name}{{{labels}}}", "values": f"0+{per_minute}x{MINUTES}"}


def gauge(name: str, labels: str, value: int) -> dict[str, str]:
    return {"series": f"{name}{{{labels}}}", "values": f"{value}x{MINUTES}"}


def series() -> list[dict[str, str]]:
    """Both engines' processes as a scrape labels them."""
    out = []
    for rank in ("0", "1"):  # SGLang, TP 2: each rank's scheduler, its own endpoint
        labels = process(f"sglang:{30000 + int(rank)}", "sglang", tp_rank=rank)
        out += [counter("kvobs_lookups_total", labels, SGLANG_LOOKUPS),
                counter("kvobs_lookup_tokens_total", labels + ',outcome="miss"', SGLANG_TOKENS),
                counter("kvobs_lookup_tokens_total", labels + ',outcome="host_hit"',
                        SGLANG_HOST_TOKENS),
                counter("kvobs_transfer_bytes_total", labels + ',src_tier="host",dst_tier="gpu"',
                        SHARD_BYTES),
                gauge("kvobs_tier_capacity_blocks", labels + ',tier="gpu"', 1000)]
    core = process("vllm:9464", "vllm", dp_rank="0")
    worker = process("vllm:9564", "vllm", dp_rank="0", tp_rank="0")  # opt-in worker
    out += [counter("kvobs_lookups_total", core, VLLM_LOOKUPS),
            counter("kvobs_lookup_tokens_total", core + ',outcome="miss"', VLLM_TOKENS),
            gauge("kvobs_tier_capacity_blocks", core + ',tier="gpu"', 500),
            counter("kvobs_lookups_total", worker, 0)]
    return out


def panel_expr(stem: str, title: str) -> str:
    (panel,) = [p for p in data_panels(dashboard_json(stem)) if p["title"] == title]
    (target,) = panel["targets"]
    return substitute(target["expr"], all_values("1m"))


#: (dashboard, panel, value at the end: each engine once)
PANELS = [
    ("kvobs-fleet", "Engine instances reporting", 2),
    ("kvobs-tiers", "Lookups per second", (SGLANG_LOOKUPS + VLLM_LOOKUPS) / 60),
    ("kvobs-tiers", "Lookup tokens by outcome",
     (SGLANG_TOKENS + SGLANG_HOST_TOKENS + VLLM_TOKENS) / 60),
    # the engine's bytes (both shards) over its tokens (once): the KV bytes of a token
    ("kvobs-host-pool", "Onload bytes per host hit token", 2 * SHARD_BYTES / SGLANG_HOST_TOKENS),
]


def promtool_test(tmp_path: Path) -> dict[str, Any]:
    rules = {"groups": [{"name": "panels", "rules": [
        {"record": f"panel:{i}", "expr": panel_expr(stem, title)}
        for i, (stem, title, _value) in enumerate(PANELS)]}]}
    (tmp_path / "panels.rules.yaml").write_text(yaml.safe_dump(rules))
    return {"rule_files": ["panels.rules.yaml"], "evaluation_interval": "1m", "tests": [{
        "interval": "1m", "input_series": series(),
        "promql_expr_test": [
            {"expr": f"sum(panel:{i})", "eval_time": f"{MINUTES - 1}m",
             "exp_samples": [{"labels": "{}", "value": value}]}
            for i, (_stem, _title, value) in enumerate(PANELS)]}]}


def run_promtool(promtool: Path, tmp_path: Path, test: dict[str, Any]) -> str:
    (tmp_path / "panels.test.yaml").write_text(yaml.safe_dump(test))
    result = subprocess.run([str(promtool), "test", "rules", "panels.test.yaml"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=120)
    return "" if result.returncode == 0 else result.stdout + result.stderr


def test_each_engine_counts_once_on_the_panels(promtool: Path, tmp_path: Path) -> None:
    failure = run_promtool(promtool, tmp_path, promtool_test(tmp_path))
    assert not failure, failure


def test_the_check_bites_on_a_panel_that_counts_every_process(promtool: Path,
                                                              tmp_path: Path) -> None:
    """The same panels without their one-process-per-engine selector count SGLang twice."""
    test = promtool_test(tmp_path)
    rules = yaml.safe_load((tmp_path / "panels.rules.yaml").read_text())
    for rule in rules["groups"][0]["rules"]:
        rule["expr"] = rule["expr"].replace('tp_rank=~"|0", ', "").replace(', tp_rank=~"|0"', "")
    (tmp_path / "panels.rules.yaml").write_text(yaml.safe_dump(rules))
    failure = run_promtool(promtool, tmp_path, test)
    for i in range(len(PANELS)):
        assert f"sum(panel:{i})" in failure

