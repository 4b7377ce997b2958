"""The host pool's net benefit on a real Prometheus scraping the real multi-process engine.

vLLM's default multi-process engine (an engine-core and a worker process, kvobs in each
through vLLM's plugin loader, one ``/metrics`` endpoint per process) runs the chat
workload of ``engine_run.py`` with a configured prefill cost, while a real Prometheus
scrapes both endpoints every second with kvobs's shipped recording rules loaded. The
engine waits before its first request until Prometheus has scraped both endpoints (so
every counter's first sample is 0) and after its last until the test has read the rules.

Truth is vLLM's own registry: its external (host) prefix-cache hit tokens times the
configured cost is the saving, its ``vllm:kv_offload_load_time`` (one worker: nothing to
divide) the onload time. The rule's answer must be that saving minus that onload time,
for the one engine the two processes make.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tests.engines.vllm032.conftest import HERE, RUN_TIMEOUT_S, Samples
from tests.required import REPO, find_tool

T = TypeVar("T")
#: Prefill seconds per token (configured): near what this run's host hits take to onload
#: per token on CPU (4e-6 to 8.5e-5 s measured, with the machine's load), so that neither
#: side of the difference hides the other.
COST = 1e-5
NET = "instance:kvobs_host_pool_net_benefit_seconds:rate5m"


def wait(what: str, probe: Callable[[], T | None], timeout_s: float,
         engine: subprocess.Popen[bytes], log: Path) -> T:
    """``probe()`` once it is not None; fail with the engine's log if it ends first."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = probe()
        if found is not None:
            return found
        if engine.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"waiting for {what}: engine exit {engine.poll()}\n"
                                 f"{log.read_text(errors='replace')[-4000:]}")
        time.sleep(0.2)


def query(url: str, expr: str, at: float | None = None) -> list[dict[str, Any]]:
    """Prometheus's instant-query result (``[{"metric": ..., "value": [ts, "v"]}]``)."""
    params = {"query": expr, **({"time": repr(at)} if at is not None else {})}
    with urllib.request.urlopen(f"{url}/api/v1/query?{urllib.parse.urlencode(params)}",
                                timeout=10) as response:
        body = json.loads(response.read())
    assert body["status"] == "success", body
    return body["data"]["result"]  # type: ignore[no-any-return]


def answer(url: str, expr: str) -> list[dict[str, Any]]:
    """:func:`query`, or nothing while Prometheus does not answer yet."""
    try:
        return query(url, expr)
    except OSError:  # not listening yet (URLError is an OSError)
        return []


def one(url: str, expr: str, at: float | None = None) -> float:
    result = query(url, expr, at)
    assert len(result) == 1, (expr, result)
    return float(result[0]["value"][1])


def start_prometheus(workdir: Path, targets: list[str]) -> tuple[subprocess.Popen[bytes], str]:
    """Prometheus scraping ``targets`` every second with kvobs's recording rules."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    config = {"global": {"scrape_interval": "1s", "scrape_timeout": "1s",
                         "evaluation_interval": "1s"},
              "rule_files": [str(REPO / "dashboards/rules/kvobs-recording.rules.yaml")],
              "scrape_configs": [{"job_name": "vllm", "static_configs": [{"targets": targets}]}]}
    (workdir / "prometheus.yml").write_text(json.dumps(config))  # JSON is YAML
    with (workdir / "prometheus.log").open("wb") as log:
        process = subprocess.Popen(
            [str(find_tool("prometheus", "scripts/deps/prometheus.sh")),
             f"--config.file={workdir / 'prometheus.yml'}",
             f"--storage.tsdb.path={workdir / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    return process, f"http://127.0.0.1:{port}"


def test_net_benefit_is_vllms_saving_minus_its_onload_time(tmp_path: Path) -> None:
    hold, log, out = tmp_path / "hold", tmp_path / "engine.log", tmp_path / "account.json"
    hold.mkdir()
    environ = {k: v for k, v in os.environ.items() if not k.startswith("KVOBS_")}
    environ.update(KVOBS_ENABLE="1", KVOBS_LOG_FORMAT="json", KVOBS_SUMMARY_INTERVAL_S="0",
                   KVOBS_PREFILL_SECONDS_PER_TOKEN=repr(COST), KVOBS_TEST_HOLD_DIR=str(hold),
                   HF_HUB_OFFLINE="1")
    with log.open("wb") as sink:
        engine = subprocess.Popen(
            [sys.executable, str(HERE / "engine_run.py"), str(out), "--mode", "multi",
             "--workdir", str(tmp_path)], cwd=tmp_path, env=environ, stdout=sink,
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    prometheus = None
    try:
        wait("the engine to start", lambda: (hold / "ready").exists() or None,
             RUN_TIMEOUT_S, engine, log)
        port = json.loads((hold / "ready").read_text())["kvobs_port"]
        core, worker = f"127.0.0.1:{port}", f"127.0.0.1:{port + 100}"  # kvobs's ports
        prometheus, url = start_prometheus(tmp_path, [core, worker])
        wait("Prometheus to scrape both processes", lambda: True if answer(
            url, 'count(kvobs_lookups_total) == 2 and count(up == 1) == 2') else None,
             60, engine, log)
        (hold / "go").write_text("")
        wait("the workload", lambda: (hold / "done").exists() or None, RUN_TIMEOUT_S,
             engine, log)
        done = time.time()
        net = wait("the rule evaluated on the final counters", lambda: query(
            url, f"{NET} and on () (min(timestamp(kvobs_lookups_total)) > {done + 2})")
            or None, 60, engine, log)
        at = one(url, f"timestamp({NET})")  # when the rule computed it: its window
        net = query(url, NET, at)
        saved_rate = one(url, f'rate(kvobs_prefill_saved_seconds_total{{tier="host",'
                              f'instance="{core}"}}[5m])', at)
        saved = one(url, f'kvobs_prefill_saved_seconds_total{{tier="host",instance="{core}"}}',
                    at)
        onload = one(url, 'kvobs_transfer_seconds_total{src_tier="host",dst_tier="gpu"}', at)
        sources = {r["metric"]["source"] for r in query(url, "kvobs_prefill_cost_info", at)}
    finally:
        (hold / "release").write_text("")
        try:
            engine.wait(timeout=RUN_TIMEOUT_S)
        finally:
            if prometheus is not None:
                prometheus.terminate()
                prometheus.wait(timeout=15)
    assert engine.returncode == 0, log.read_text(errors="replace")[-4000:]
    vllm = Samples(json.loads(out.read_text())["vllm"])

    # One engine, two processes, one answer: the engine core's, which counts both sides.
    # The worker exports a saving of 0 and no onload seconds (its link only times shards):
    # unknown there, so no sample (a rule reading a missing onload as 0 s answered 0).
    assert len(net) == 1 and net[0]["metric"]["instance"] == core
    assert sources == {"configured"}
    host_hit_tokens = vllm.total("vllm:external_prefix_cache_hits_total")
    load_s = vllm.total("vllm:kv_offload_load_time_total")
    assert saved == pytest.approx(host_hit_tokens * COST, rel=1e-9) and saved > 0
    assert onload == pytest.approx(load_s, rel=1e-9) and onload > 0
    # Both counters come from one scrape of one process, from 0: their rates over the
    # window are their totals times one factor, so the rule's answer is the saving's
    # rate times (1 - vLLM's onload time / vLLM's saving), both read at the instant the
    # rule was evaluated. Slack: a scrape landing during that evaluation.
    share = load_s / (host_hit_tokens * COST)
    assert share > 0.1, "the onload time must show in the answer"
    assert float(net[0]["value"][1]) == pytest.approx(saved_rate * (1 - share), rel=0.005)
