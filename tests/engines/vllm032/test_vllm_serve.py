"""A user's run: ``vllm serve`` with kvobs, Prometheus as the docs configure it, every
dashboard panel and recording rule against vLLM's own series, ``kvobs report`` and
``kvobs top``.

The run (``serve_run.py``): vLLM's installed ``vllm serve`` command on the tiny model with
prefix caching, a 31-block GPU pool, a 48-chunk host tier (``OffloadingConnector``) and
kvobs's plugin; a real Prometheus running ``docs/deployment/prometheus.md``'s config
(15 s scrapes, the rules ``kvobs dashboards --out`` writes, one kvobs target: the engine
core's endpoint) plus a job for vLLM's ``/metrics``; three clients chatting over HTTP (two
chats each, nine turns, each turn resending the history), so that earlier turns leave the
GPU pool and come back from the host tier.

Everything is read at one instant ``E``: an evaluation of the recording rules, planned so
that every window ending there (1 minute at least) holds the whole chat traffic and, on
both targets, a sample from before it (counters at 0) and one from after it. At ``E``:

* every panel query of every dashboard (``tests/e2e/test_e2e_stack.panel_queries``, with
  ``$__rate_interval`` = 4 scrape intervals, as Grafana sets it) has finite data, but for
  the metrics :data:`EMPTY_HERE` names;
* each panel (:data:`PANEL_CHECKS`) and recording rule (:data:`RULE_CHECKS`) equals the
  same figure computed in PromQL from vLLM's own series on the same Prometheus, or from
  kvobs's raw counters where vLLM counts nothing alike (thrash, reuse). A ratio of two
  counters of one target is exact; a rate compared across the two targets differs by
  where each target's samples fall in the window (Prometheus extrapolates a rate to the
  window's end), which :meth:`Run.scale` computes from the samples: exact too, so a
  flipped sign, a unit or a window slip fails;
* the totals equal vLLM's counters, its KV cache events and the clients' HTTP answers.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvobs.report.prometheus_api import PrometheusClient, Series
from kvobs.snapshot import MISS_CAUSES
from kvobs.top.model import quantile
from kvobs.units import format_value
from tests.e2e.e2e_servers import Server, http_ok, poll
from tests.engines.vllm032.engine_run import EventLog, free_port, host_chunk_bytes
from tests.engines.vllm032.serve_run import (
    HOST_CHUNKS,
    PREFILL_COST,
    REPO,
    Traffic,
    bytes_per_token,
    chat_traffic,
    doc_prometheus_config,
    http_json,
    kv_transfer_config,
    start_server,
)
from tests.required import find_tool, missing

#: The main venv (``make setup``): ``panel_queries`` renders the dashboards with grafanalib
#: and ``kvobs report`` draws with matplotlib, neither of which vLLM's venv has.
MAIN_PYTHON = REPO / ".venv" / "bin" / "python"
PANELS = """
import json, sys
import tests.e2e.test_e2e_stack as stack
stack.RATE_INTERVAL = sys.argv[1]
print(json.dumps([[s, t, e, stack.gpu_only(e)] for s, t, e in stack.panel_queries()]))
"""
#: Metrics that legitimately have no series on this engine, and why.
EMPTY_HERE = {
    "kvobs_pcie_peak_bandwidth_bytes_per_second":
        "NVML's PCIe link gauge: vLLM's CPU build runs on no NVIDIA GPU",
}
#: Seconds the chats may take (3 s measured on a busy 2-core machine).
TRAFFIC_BUDGET_S = 16
#: The rule group whose evaluation E is: the instance rules (the fleet rules read them).
PLANNED_GROUP = "kvobs.instance"
MARGIN_S = 2

STORE, LOAD = "GPU_to_CPU", "CPU_to_GPU"
LINKS = {("gpu", "host"): STORE, ("host", "gpu"): LOAD}  # vLLM's transfer_type per link
ONLOAD = [("host", "gpu")]


@dataclass(eq=False)
class Run:
    """The stack, and what Prometheus says at the planned rule evaluation ``at``."""

    server: Any
    prometheus: Server
    events: EventLog
    traffic: Traffic
    at: float
    config: dict[str, Any]
    rules_dir: Path
    panels: list[tuple[str, str, str, bool]]
    rate_window_s: int
    kv_events: dict[str, int] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    left_running: list[int] | None = None

    def query(self, expr: str) -> list[Series]:
        return PrometheusClient(self.prometheus.url, timeout_s=30).query(expr, self.at)

    def value(self, expr: str) -> float:
        """The sum of ``expr`` at ``at`` (0 where it has no series)."""
        series = self.query(f"sum({expr})")
        return series[0].samples[0][1] if series else 0.0

    @cache  # noqa: B019 - one Run a module
    def factor(self, selector: str, window_s: int) -> float:
        """``rate(selector[window])`` at ``at`` is the counter's increase over the window's
        samples / the window x this: Prometheus's extrapolation (``extrapolatedRate``) for
        a counter whose first sample in the window is 0 (nothing to the window's start; to
        its end when within 1.1 sample intervals, else half an interval), in Prometheus's
        integer milliseconds. Asserts that the window holds a sample from before the
        traffic (0) and one from after it."""
        [series] = self.query(f"{selector}[{window_s}s]")
        stamps = [round(t * 1000) for t, _v in series.samples]
        assert series.samples[0][1] == 0 and series.samples[0][0] < self.traffic.started, \
            (selector, series.samples)
        assert series.samples[-1][0] > self.traffic.ended, (selector, series.samples)
        sampled = stamps[-1] - stamps[0]
        average = sampled / (len(stamps) - 1)
        to_end = round(self.at * 1000) - stamps[-1]
        return (sampled + (to_end if to_end < 1.1 * average else average / 2)) / sampled

    def scale(self, window_s: int) -> float:
        """A rate on vLLM's target times this: that rate as kvobs's target samples it."""
        return self.factor("kvobs_lookups_total", window_s) / \
            self.factor("vllm:prefix_cache_queries_total", window_s)

    def vllm_rate(self, selector: str, window_s: int | None = None) -> float:
        """``rate()`` of vLLM's counter in PromQL, as kvobs's target's samples give it."""
        window = window_s or self.rate_window_s
        return self.value(f"rate({selector}[{window}s])") * self.scale(window)

    def raw_rate(self, selector: str) -> float:
        """``rate()`` of a kvobs counter from its total (0 at the window's start)."""
        window = self.rate_window_s
        return self.value(selector) * self.factor("kvobs_lookups_total", window) / window

    @cache  # noqa: B019
    def vllm_config(self) -> dict[str, str]:
        [info] = self.query("vllm:cache_config_info")
        return info.labels

    @property
    def gpu_blocks(self) -> int:
        """vLLM's GPU pool less its null block."""
        return int(self.vllm_config()["num_gpu_blocks"]) - 1

    @property
    def block_tokens(self) -> int:
        return int(self.vllm_config()["block_size"])

    def cached(self, medium: str) -> int:
        """Blocks cached on ``medium`` (``GPU``, ``CPU``) by vLLM's KV cache events."""
        return self.kv_events.get(f"BlockStored/{medium}", 0) - \
            self.kv_events.get(f"BlockRemoved/{medium}", 0)

    def stop(self) -> list[int]:
        """Stop everything; the pids of vLLM's processes that outlived ``vllm serve``."""
        if self.left_running is None:
            self.left_running = self.server.stop()
        self.prometheus.stop()
        self.events.close()
        return self.left_running


def rule_phase(url: str, group: str) -> tuple[float, float]:
    """(last evaluation as unix seconds, interval) of the rule group ``group``."""
    groups = http_json(f"{url}/api/v1/rules")["data"]["groups"]
    [found] = [g for g in groups if g["name"] == group]
    stamp = re.sub(r"(\.\d{6})\d*", r"\1", found["lastEvaluation"]).replace("Z", "+00:00")
    return dt.datetime.fromisoformat(stamp).timestamp(), float(found["interval"])


def start_prometheus(workdir: Path, config: dict[str, Any]) -> Server:
    """``promtool check config`` then ``prometheus`` on it, as the doc runs them."""
    (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
    promtool = find_tool("promtool", "scripts/deps/prometheus.sh")
    check = subprocess.run([str(promtool), "check", "config", "prometheus.yml"],
                           cwd=workdir, capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    port, log = free_port(), workdir / "prometheus.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [str(find_tool("prometheus", "scripts/deps/prometheus.sh")),
             "--config.file=prometheus.yml", f"--storage.tsdb.path={workdir / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{port}"],
            cwd=workdir, stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    server = Server(process, f"http://127.0.0.1:{port}", log)
    poll("Prometheus /-/ready", lambda: http_ok(server.url + "/-/ready"), 30, log)
    return server


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    if not MAIN_PYTHON.exists():
        missing(f"{MAIN_PYTHON} is missing: run `make setup`")
    begun = time.monotonic()
    workdir = tmp_path_factory.mktemp("serve")
    endpoint = f"ipc://{workdir}/kv-events"
    events = EventLog(endpoint)
    server = start_server(workdir, endpoint)
    prometheus: Server | None = None
    panels_job: subprocess.Popen[str] | None = None
    try:
        # The doc's steps: `kvobs dashboards --out` writes the rules, then its config
        etc = workdir / "etc-kvobs"
        subprocess.run([str(Path(sys.executable).parent / "kvobs"), "dashboards", "--out",
                        str(etc)], check=True, capture_output=True, timeout=60)
        config = doc_prometheus_config(server.kvobs_port, etc, f"127.0.0.1:{server.port}")
        prometheus = start_prometheus(workdir, config)
        scrape_s = float(config["global"]["scrape_interval"].removesuffix("s"))
        rate_window_s = int(4 * scrape_s)  # Grafana's $__rate_interval at the least
        panels_job = subprocess.Popen([str(MAIN_PYTHON), "-c", PANELS, f"{rate_window_s}s"],
                                      cwd=REPO, stdout=subprocess.PIPE, text=True)
        server.wait_ready()
        ready = time.time()
        timings = {"vllm serve ready": time.monotonic() - begun}
        client = PrometheusClient(prometheus.url)
        poll("both targets scraped since the server is ready", lambda: {
            s.labels["job"] for s in client.query("timestamp(up == 1)")
            if s.samples[0][1] > ready} >= {"kvobs", "vllm"} or None, 3 * scrape_s,
             prometheus.log)
        poll("a first rule evaluation", lambda: rule_phase(
            prometheus.url, PLANNED_GROUP)[0] > 0 or None, 90, prometheus.log)
        last, interval = rule_phase(prometheus.url, PLANNED_GROUP)
        # E: the first evaluation the traffic can end a scrape interval before, starting
        # after both targets' last scrapes in E's window (each within a scrape interval)
        at = last + interval * math.ceil(
            (time.time() + TRAFFIC_BUDGET_S + scrape_s + MARGIN_S - last) / interval)
        time.sleep(max(0.0, at - interval + scrape_s + MARGIN_S - time.time()))
        traffic = chat_traffic(server.url, "tiny")
        time.sleep(1.0)  # the API server records the stats the engine core sends last
        traffic.ended = time.time()
        timings["chats"] = traffic.ended - traffic.started
        assert traffic.ended + scrape_s + MARGIN_S <= at, \
            f"the chats took {timings['chats']:.1f} s, over the {TRAFFIC_BUDGET_S} s planned"
        time.sleep(max(0.0, at + MARGIN_S - time.time()))
        at = poll("the planned rule evaluation", lambda: max(  # E to the millisecond
            (s.samples[0][1] for s in client.query(
                "timestamp(instance:kvobs_lookup_tokens:rate1m)", at + MARGIN_S)
             if abs(s.samples[0][1] - at) < 1), default=None), 30, prometheus.log)
        output, _ = panels_job.communicate(timeout=120)
        assert panels_job.returncode == 0
        timings["until E"] = time.monotonic() - begun
        yield Run(server, prometheus, events, traffic, at, config, etc / "rules",
                  [tuple(p) for p in json.loads(output)], rate_window_s,
                  kv_events=events.settle(), timings=timings)
    finally:
        server.stop()
        if prometheus is not None:
            prometheus.stop()
        if panels_job is not None and panels_job.poll() is None:
            panels_job.kill()
            panels_job.wait()
        events.close()


def by(series: list[Series], *keys: str) -> dict[tuple[str, ...], float]:
    """Each series' value keyed by its ``keys`` labels."""
    found = {tuple(s.labels.get(k, "") for k in keys): s.samples[0][1] for s in series}
    assert len(found) == len(series), series
    return found


def approx(value: float) -> Any:
    return pytest.approx(value, rel=1e-9, abs=1e-12)


# -- the doc's configuration ------------------------------------------------------------------

def test_prometheus_runs_the_docs_config_with_one_kvobs_target(run: Run) -> None:
    jobs = {job["job_name"]: job for job in run.config["scrape_configs"]}
    assert set(jobs) == {"kvobs", "vllm"}
    assert jobs["kvobs"]["static_configs"] == [
        {"targets": [f"127.0.0.1:{run.server.kvobs_port}"]}]
    assert by(run.query("up"), "job") == {("kvobs",): 1, ("vllm",): 1}
    # The engine core's endpoint carries every series, transfer durations included; the
    # worker's opt-in endpoint (base + 100) serves nothing by default.
    assert len(run.query('kvobs_transfer_duration_seconds_count{job="kvobs"}')) == 2
    assert not http_ok(f"http://127.0.0.1:{run.server.kvobs_port + 100}/metrics")
    # Every rule of the files the doc's glob names is loaded and healthy.
    loaded = http_json(f"{run.prometheus.url}/api/v1/rules")["data"]["groups"]
    names = {r.get("record") or r["alert"] for path in run.rules_dir.glob("*.rules.yaml")
             for g in yaml.safe_load(path.read_text())["groups"] for r in g["rules"]}
    assert {r["name"] for g in loaded for r in g["rules"]} == names
    assert {r["health"] for g in loaded for r in g["rules"]} == {"ok"}
    [info] = run.query("kvobs_engine_info")  # the engine vLLM serves, a release kvobs tests
    assert info.labels["model"] == "tiny" and info.labels["support"] == "tested"


# -- (a) every panel has data -------------------------------------------------------------------

def test_every_panel_query_has_finite_data_unless_listed(run: Run) -> None:
    problems = []
    for stem, title, expr, gpu_only in run.panels:
        series = run.query(expr)
        names = set(re.findall(r"\b(kvobs_\w+)\{", expr))
        if names & set(EMPTY_HERE):
            assert gpu_only and series == [], (title, expr, series)  # the reason holds
        elif not series:
            problems.append(f"{stem} / {title}: empty: {expr}")
        elif any(not math.isfinite(v) for s in series for _t, v in s.samples):
            problems.append(f"{stem} / {title}: not finite {series}: {expr}")
    assert not problems, "\n".join(problems)
    assert {t for _s, t, _e, _g in run.panels} == set(PANEL_CHECKS)  # each panel compared


# -- (b) the totals are vLLM's ------------------------------------------------------------------

def test_lookups_are_vllms_prefix_cache_and_the_clients_answers(run: Run) -> None:
    v, answers = run.value, run.traffic.requests
    assert v("vllm:num_preemptions_total") == 0  # one lookup per request
    assert v("kvobs_lookups_total") == v("vllm:request_success_total") == len(answers)
    gpu = v('kvobs_lookup_tokens_total{outcome="gpu_hit"}')
    host = v('kvobs_lookup_tokens_total{outcome="host_hit"}')
    assert gpu == v("vllm:prefix_cache_hits_total") == \
        v('vllm:prompt_tokens_cached_by_source_total{source="device"}') > 0
    assert host == v("vllm:external_prefix_cache_hits_total") == \
        v('vllm:prompt_tokens_cached_by_source_total{source="host"}') > 0
    assert v('kvobs_lookup_tokens_total{outcome="disk_hit"}') == 0
    assert v("kvobs_lookup_tokens_total") == v("vllm:prefix_cache_queries_total") == \
        sum(a["prompt_tokens"] for a in answers)
    # what each client was told it did not compute (--enable-prompt-tokens-details)
    assert gpu + host == sum(a["prompt_tokens_details"]["cached_tokens"] for a in answers)


def test_miss_causes_add_up_to_vllms_missed_tokens_in_every_scrape(run: Run) -> None:
    """At every scrape from before the chats to E, kvobs's causes sum to the tokens vLLM
    neither hit nor loaded from its host tier (its own counters, scraped from its own
    endpoint at most a scrape interval apart: compared at the end, exactly, and at every
    scrape against kvobs's own miss outcome)."""
    client = PrometheusClient(run.prometheus.url, timeout_s=30)
    gaps = client.query_range(
        "sum(kvobs_miss_tokens_total) - sum(kvobs_lookup_tokens_total{outcome=\"miss\"})",
        run.traffic.started - 5, run.at, 1.0)
    assert gaps and all(v == 0 for s in gaps for _t, v in s.samples), gaps
    missed = run.value("vllm:prefix_cache_queries_total") - run.value(
        "vllm:prefix_cache_hits_total + vllm:external_prefix_cache_hits_total")
    assert run.value("kvobs_miss_tokens_total") == missed > 0
    assert run.value('kvobs_miss_tokens_total{cause="unknown"}') == 0


@pytest.mark.parametrize("link", sorted(LINKS), ids="->".join)
def test_transfers_are_vllms_offload_counters(run: Run, link: tuple[str, str]) -> None:
    v, kind, vllm_type = run.value, {STORE: "store", LOAD: "load"}[LINKS[link]], LINKS[link]
    sel = f'src_tier="{link[0]}",dst_tier="{link[1]}"'
    moved = v(f"vllm:kv_offload_{kind}_bytes_total")
    assert v(f"kvobs_transfer_bytes_total{{{sel}}}") == moved == \
        v(f'vllm:kv_offload_total_bytes_total{{transfer_type="{vllm_type}"}}') > 0
    assert v(f"kvobs_transfer_blocks_total{{{sel}}}") * host_chunk_bytes() == moved
    jobs = v(f"vllm:kv_offload_{kind}_size_count")
    assert v(f"kvobs_transfer_operations_total{{{sel}}}") == jobs == \
        v(f'vllm:kv_offload_size_count{{transfer_type="{vllm_type}"}}') > 0
    assert v(f"kvobs_transfer_duration_seconds_count{{{sel}}}") == jobs
    seconds = v(f"vllm:kv_offload_{kind}_time_total")
    assert seconds == v(f'vllm:kv_offload_total_time_total{{transfer_type="{vllm_type}"}}')
    assert v(f"kvobs_transfer_seconds_total{{{sel}}}") == approx(seconds)
    assert v(f"kvobs_transfer_duration_seconds_sum{{{sel}}}") == approx(seconds)
    assert v(f"kvobs_transfer_failures_total{{{sel}}}") == 0


def test_tiers_are_vllms_pools_and_kv_events(run: Run) -> None:
    v, events = run.value, run.kv_events
    assert run.vllm_config()["enable_prefix_caching"] == "True"
    assert by(run.query("kvobs_tier_capacity_blocks"), "tier") == {
        ("gpu",): run.gpu_blocks, ("host",): HOST_CHUNKS}
    check_equal(by(run.query("kvobs_tier_capacity_bytes"), "tier"), capacity_bytes(run))
    # in use as vLLM's usage gauges say (idle now: both 0), cached as its KV events say
    assert v('kvobs_tier_resident_blocks{tier="gpu",state="in_use"}') / run.gpu_blocks == \
        v("vllm:kv_cache_usage_perc")
    assert v('kvobs_tier_resident_blocks{tier="host",state="in_use"}') / HOST_CHUNKS == \
        v("vllm:kv_offload_cpu_cache_usage_perc")
    assert v('kvobs_tier_resident_blocks{tier="gpu",state="cached"}') == run.cached("GPU") > 0
    assert v('kvobs_tier_resident_blocks{tier="host",state="cached"}') == run.cached("CPU") > 0
    for tier, medium in (("gpu", "GPU"), ("host", "CPU")):
        assert v(f'kvobs_block_evictions_total{{tier="{tier}"}}') == \
            v(f'kvobs_block_evictions_total{{tier="{tier}",reason="capacity"}}') == \
            events[f"BlockRemoved/{medium}"] > 0
    assert v('kvobs_block_stores_total{tier="host"}') == events["BlockStored/CPU"] == \
        v("vllm:kv_offload_cpu_allocation_size_sum")


# -- (b) each panel and rule is vLLM's figure -----------------------------------------------

Figure = Callable[[Run], dict[tuple[str, ...], float]]
SeriesCheck = Callable[[Run, list[Series]], None]


def check_equal(got: dict[tuple[str, ...], float], want: dict[tuple[str, ...], float]) -> None:
    assert set(got) == set(want), (got, want)
    for key, value in want.items():
        assert got[key] == approx(value), (key, got, want)


def capacity_bytes(run: Run) -> dict[tuple[str, ...], float]:
    """vLLM's GPU pool (blocks x block size x the model's bytes per token) and the host
    bytes its offloading connector was given."""
    host = kv_transfer_config()["kv_connector_extra_config"]["cpu_bytes_to_use"]
    return {("gpu",): run.gpu_blocks * run.block_tokens * bytes_per_token(), ("host",): host}


def capacity_tokens(run: Run) -> dict[tuple[str, ...], float]:
    return {("gpu",): run.gpu_blocks * run.block_tokens, ("host",): HOST_CHUNKS * run.block_tokens}


def hit_ratios(run: Run) -> dict[str, float]:
    """vLLM's hit ratios in PromQL over the rate window (one target: exact)."""
    w = run.rate_window_s
    queries = f"scalar(sum(rate(vllm:prefix_cache_queries_total[{w}s])))"
    gpu = run.value(f"rate(vllm:prefix_cache_hits_total[{w}s]) / {queries}")
    host = run.value(f"rate(vllm:external_prefix_cache_hits_total[{w}s]) / {queries}")
    return {"gpu": gpu, "host": host, "disk": 0.0}


def hit_ratio_by_outcome(run: Run) -> dict[tuple[str, ...], float]:
    return {(f"{tier}_hit",): ratio for tier, ratio in hit_ratios(run).items()}


def hit_ratio_by_tier(run: Run) -> dict[tuple[str, ...], float]:
    return {(tier,): ratio for tier, ratio in hit_ratios(run).items()}


def hit_ratio(run: Run) -> float:
    return sum(hit_ratios(run).values())


def lookup_rates(run: Run) -> dict[tuple[str, ...], float]:
    gpu = run.vllm_rate("vllm:prefix_cache_hits_total")
    host = run.vllm_rate("vllm:external_prefix_cache_hits_total")
    miss = run.vllm_rate("vllm:prefix_cache_queries_total") - gpu - host
    return {("gpu_hit",): gpu, ("host_hit",): host, ("disk_hit",): 0.0, ("miss",): miss}


def bandwidth(run: Run) -> dict[tuple[str, ...], float]:
    return {link: run.vllm_rate(f'vllm:kv_offload_total_bytes_total{{transfer_type="{kind}"}}')
            for link, kind in LINKS.items()}


def saved_rate(run: Run, window_s: int | None = None) -> float:
    """Host hit tokens x the configured prefill cost."""
    return PREFILL_COST * run.vllm_rate("vllm:external_prefix_cache_hits_total", window_s)


def onload_rate(run: Run, window_s: int | None = None) -> float:
    return run.vllm_rate(f'vllm:kv_offload_total_time_total{{transfer_type="{LOAD}"}}', window_s)


def net_benefit(run: Run, window_s: int | None = None) -> float:
    return saved_rate(run, window_s) - onload_rate(run, window_s)


def vllm_blocks(run: Run, transfer_type: str) -> float:
    """Blocks vLLM moved one way: its bytes over a chunk's."""
    total = run.value(f'vllm:kv_offload_total_bytes_total{{transfer_type="{transfer_type}"}}')
    return total / host_chunk_bytes()


def buckets(run: Run, src: str, dst: str) -> dict[float, float]:
    found = run.query(
        f'kvobs_transfer_duration_seconds_bucket{{src_tier="{src}",dst_tier="{dst}"}}')
    return {float(s.labels["le"]): s.samples[0][1] for s in found}


def latency(q: float, links: list[tuple[str, str]]) -> Figure:
    """The quantile of the duration histogram's raw bucket counts (``kvobs top``'s
    interpolation): every window holds all of them, from 0."""
    def figure(run: Run) -> dict[tuple[str, ...], float]:
        return {link: quantile(q, buckets(run, *link)) or math.nan for link in links}
    return figure


def heatmap(links: list[tuple[str, str]]) -> SeriesCheck:
    """Each bucket's rate is its raw count's; all of them (+Inf) are vLLM's jobs."""
    def check(run: Run, series: list[Series]) -> None:
        got = {float(le): value for (le,), value in by(series, "le").items()}
        counts = [buckets(run, *link) for link in links]
        per_s = run.raw_rate("kvobs_lookups_total") / run.value("kvobs_lookups_total")
        want = {le: sum(c[le] for c in counts) * per_s for le in counts[0]}
        assert set(got) == set(want) and all(got[le] == approx(want[le]) for le in want)
        jobs = sum(run.vllm_rate(f'vllm:kv_offload_size_count{{transfer_type="{LINKS[link]}"}}')
                   for link in links)
        assert got[math.inf] == approx(jobs) and jobs > 0
    return check


def occupancy(run: Run) -> dict[tuple[str, ...], float]:
    """In use (vLLM's usage gauges) plus cached (its KV events), over the capacity."""
    return {("gpu",): run.value("vllm:kv_cache_usage_perc") + run.cached("GPU") / run.gpu_blocks,
            ("host",): run.value("vllm:kv_offload_cpu_cache_usage_perc")
            + run.cached("CPU") / HOST_CHUNKS}


def in_use_share(run: Run) -> dict[tuple[str, ...], float]:
    return {("gpu",): run.value("vllm:kv_cache_usage_perc"),
            ("host",): run.value("vllm:kv_offload_cpu_cache_usage_perc")}


def cached_share(run: Run) -> dict[tuple[str, ...], float]:
    return {("gpu",): run.cached("GPU") / run.gpu_blocks,
            ("host",): run.cached("CPU") / HOST_CHUNKS}


def resident_bytes(run: Run) -> dict[tuple[str, ...], float]:
    """In use (vLLM's usage gauges) and cached (its KV events) per tier, in bytes."""
    chunk = host_chunk_bytes()
    share = in_use_share(run)
    return {("gpu", "in_use"): share[("gpu",)] * run.gpu_blocks * chunk,
            ("host", "in_use"): share[("host",)] * HOST_CHUNKS * chunk,
            ("gpu", "cached"): run.cached("GPU") * chunk,
            ("host", "cached"): run.cached("CPU") * chunk}


def evictions(run: Run) -> dict[tuple[str, ...], float]:
    """vLLM's ``BlockRemoved`` events per medium, as rates over the window."""
    per_s = run.raw_rate("kvobs_lookups_total") / run.value("kvobs_lookups_total")
    reasons = ("capacity", "explicit", "reset", "other")
    want: dict[tuple[str, ...], float] = {(t, r): 0.0 for t in ("gpu", "host") for r in reasons}
    want[("gpu", "capacity")] = run.kv_events["BlockRemoved/GPU"] * per_s
    want[("host", "capacity")] = run.kv_events["BlockRemoved/CPU"] * per_s
    return want


def host_only(figure: Figure) -> Figure:
    return lambda run: {k: v for k, v in figure(run).items() if k[0] == "host"}


def reuse_sizes(run: Run) -> float:
    """The reuse profile's size: the largest tier (kvobs's tiers keep copies of each
    other), from vLLM's GPU pool and the host chunks its connector was given."""
    return max(run.gpu_blocks, HOST_CHUNKS)


def raw(name: str) -> Callable[[Run], float]:
    return lambda run: run.raw_rate(name)


def ratio(numerator: Callable[[Run], float], denominator: Callable[[Run], float]
          ) -> Callable[[Run], float]:
    return lambda run: numerator(run) / denominator(run)


def total(name: str) -> Callable[[Run], float]:
    return lambda run: run.value(name)


def keyed(figure: Figure, *keys: str) -> SeriesCheck:
    def check(run: Run, series: list[Series]) -> None:
        check_equal(by(series, *keys), figure(run))
    return check


def scalar(figure: Callable[[Run], float]) -> SeriesCheck:
    def check(run: Run, series: list[Series]) -> None:
        [only] = series
        assert only.samples[0][1] == approx(figure(run))
    return check


def zero(*keys: str) -> SeriesCheck:
    def check(run: Run, series: list[Series]) -> None:
        assert series and set(by(series, *keys).values()) == {0.0}
    return check


def empty(run: Run, series: list[Series]) -> None:
    assert series == []


def whatif_curve(run: Run) -> dict[tuple[str, ...], float]:
    """The what-if curve per size ``le`` from kvobs's raw reuse counters (exported from 0,
    one target: their rates over one window are their totals times one factor): the
    sampled hits below each size, plus the references the sample missed, over the
    references expected at the sample rate (SHARDS-adj), within [0, 1]."""
    sampled = by(run.query("kvobs_reuse_sampled_references_total"), "le")
    expected = run.value("kvobs_reuse_references_total") * run.value("kvobs_reuse_sample_rate")
    missed = expected - sampled.pop(("+Inf",))
    return {le: min(max((hits + missed) / expected, 0.0), 1.0) for le, hits in sampled.items()}


def whatif(run: Run, series: list[Series]) -> None:
    """The curve from the raw counters, and what any LRU curve of these lookups must be:
    never falling with size, and at its largest size (16x the cache) at least the share
    of vLLM's prompt tokens it hit (a token vLLM hit is in a full block seen before)."""
    keyed(whatif_curve, "le")(run, series)
    curve = [v for _size, v in sorted((float(le), v) for (le,), v in by(series, "le").items())]
    assert curve == sorted(curve) and 0 < curve[-1] <= 1, curve
    queries = run.value("vllm:prefix_cache_queries_total")
    hits = run.value("vllm:prefix_cache_hits_total + vllm:external_prefix_cache_hits_total")
    assert curve[-1] >= hits / queries, (curve, hits / queries)


def net(run: Run, series: list[Series]) -> None:
    """The saving less the onload time: the same value, so the same sign."""
    [only] = series
    want = net_benefit(run)
    assert only.samples[0][1] == approx(want)
    assert math.copysign(1, only.samples[0][1]) == math.copysign(1, want) and want != 0


def hit_rates(run: Run) -> dict[tuple[str, ...], float]:
    return {k: v for k, v in lookup_rates(run).items() if k != ("miss",)}


def miss_causes(run: Run, series: list[Series]) -> None:
    """Every cause, none negative, adding up to vLLM's missed tokens per second."""
    causes = by(series, "cause")
    assert {cause for (cause,) in causes} == set(MISS_CAUSES), causes
    assert min(causes.values()) >= 0 and causes[("cold",)] > 0, causes
    assert sum(causes.values()) == approx(lookup_rates(run)[("miss",)])


def hit_shares(run: Run, series: list[Series]) -> None:
    """The hit tiers' shares over the range (the whole run): vLLM's GPU prefix-cache hits
    and its connector's (host) hits, each over its queried tokens."""
    queries = run.value("vllm:prefix_cache_queries_total")
    shares = by(series, "outcome")
    assert shares[("gpu_hit",)] == approx(run.value("vllm:prefix_cache_hits_total") / queries)
    assert shares[("host_hit",)] == approx(
        run.value("vllm:external_prefix_cache_hits_total") / queries)


def miss_shares(run: Run, series: list[Series]) -> None:
    """The causes' shares over the range (the whole run) add up to the share of vLLM's
    prompt tokens it neither hit nor loaded from the host."""
    queries = run.value("vllm:prefix_cache_queries_total")
    hits = run.value("vllm:prefix_cache_hits_total + vllm:external_prefix_cache_hits_total")
    assert sum(by(series, "cause").values()) == approx((queries - hits) / queries)


def recoverable_share(run: Run, series: list[Series]) -> None:
    """kvobs's own count (vLLM has none alike): evicted tokens twice the capacity would
    hit, over the looked-up tokens, never above the evicted share."""
    [only] = series
    tokens = run.value("kvobs_lookup_tokens_total")
    assert only.samples[0][1] == approx(run.value("kvobs_miss_recoverable_tokens_total") / tokens)
    assert only.samples[0][1] <= run.value('kvobs_miss_tokens_total{cause="evicted"}') / tokens


LINK = ("src_tier", "dst_tier")
REUSED = total("kvobs_offloaded_reused_blocks_total")
UNUSED = total("kvobs_offloaded_evicted_unused_blocks_total")
THRASH = total("kvobs_thrash_onloads_total")

#: Every panel, by title: a check of each of its queries' answers, in order, against the
#: same figure from vLLM's series (or kvobs's raw counters where vLLM has none alike).
PANEL_CHECKS: dict[str, list[SeriesCheck]] = {
    # -- kvobs-tiers
    "Capacity per tier (tokens)": [keyed(capacity_tokens, "tier")],
    "Capacity per tier (bytes)": [keyed(capacity_bytes, "tier")],
    "Resident occupancy of $tier (in use vs cached)": [keyed(in_use_share, "tier"),
                                                       keyed(cached_share, "tier")],
    "Resident bytes of $tier": [keyed(lambda r: {k: v for k, v in resident_bytes(r).items()
                                                 if k[1] == "in_use"}, "tier", "state"),
                                keyed(lambda r: {k: v for k, v in resident_bytes(r).items()
                                                 if k[1] == "cached"}, "tier", "state"),
                                keyed(capacity_bytes, "tier")],
    "Lookup tokens by outcome": [keyed(lookup_rates, "outcome")],
    "Why lookups missed: tokens by hit tier and miss cause": [keyed(hit_rates, "outcome"),
                                                              miss_causes],
    "Looked-up tokens over the window: hits, then miss causes": [hit_shares, miss_shares,
                                                                  recoverable_share],
    "Hit ratio per tier": [keyed(hit_ratio_by_outcome, "outcome")],
    "Lookups per second": [scalar(lambda r: r.vllm_rate("vllm:request_success_total"))],
    "Transfer throughput per direction vs link peak": [keyed(bandwidth, *LINK), empty],
    "Transfer latency p50 / p99": [keyed(latency(0.5, list(LINKS)), *LINK),
                                   keyed(latency(0.99, list(LINKS)), *LINK)],
    "Transfer latency heatmap": [heatmap(list(LINKS))],
    "Drops and failures": [zero(*LINK), zero(*LINK)],
    "Thrash signals": [scalar(raw("kvobs_thrash_onloads_total")),
                       scalar(raw("kvobs_offloaded_reused_blocks_total")),
                       scalar(raw("kvobs_offloaded_evicted_unused_blocks_total"))],
    "Evictions per tier and reason": [keyed(evictions, "tier", "reason")],
    # -- kvobs-host-pool
    "Net benefit": [scalar(saved_rate), scalar(onload_rate), net],
    "Prefill saved vs onload time": [scalar(saved_rate), scalar(onload_rate)],
    "What-if: hit ratio by cache size": [
        whatif,
        keyed(lambda r: {("0",): r.gpu_blocks, ("1",): r.gpu_blocks}, "y"),
        keyed(lambda r: {("0",): reuse_sizes(r), ("1",): reuse_sizes(r)}, "y")],
    "Cache sizes": [scalar(lambda r: r.gpu_blocks), scalar(reuse_sizes)],
    "Wasted offloads": [scalar(ratio(UNUSED, lambda r: vllm_blocks(r, STORE)))],
    "Host occupancy": [keyed(host_only(in_use_share), "tier"),
                       keyed(host_only(cached_share), "tier")],
    "Host evictions by reason": [keyed(host_only(evictions), "tier", "reason")],
    "Offloaded blocks: reused vs evicted unused": [
        scalar(raw("kvobs_offloaded_reused_blocks_total")),
        scalar(raw("kvobs_offloaded_evicted_unused_blocks_total"))],
    "Offload payoff ratio": [scalar(ratio(REUSED, lambda r: REUSED(r) + UNUSED(r)))],
    "Re-onload (thrash) rate": [scalar(raw("kvobs_thrash_onloads_total"))],
    "Thrash share of onloads": [scalar(ratio(THRASH, lambda r: vllm_blocks(r, LOAD)))],
    "Onload latency p50 / p99": [keyed(latency(0.5, ONLOAD), *LINK),
                                 keyed(latency(0.99, ONLOAD), *LINK)],
    "Onload latency heatmap": [heatmap(ONLOAD)],
    "Onload bytes per host hit token": [scalar(lambda r: r.value(
        f'rate(vllm:kv_offload_total_bytes_total{{transfer_type="{LOAD}"}}[{r.rate_window_s}s])'
        f" / on () rate(vllm:external_prefix_cache_hits_total[{r.rate_window_s}s])"))],
    "Offload and onload bandwidth": [scalar(lambda r: bandwidth(r)[("gpu", "host")]),
                                     scalar(lambda r: bandwidth(r)[("host", "gpu")])],
    # -- kvobs-fleet
    "Engine instances reporting": [keyed(lambda r: {
        (r.query("vllm:prefix_cache_queries_total")[0].labels["model_name"],):
            r.value("count(vllm:cache_config_info)")}, "model")],
    "Fleet capacity per tier": [keyed(capacity_bytes, "tier")],
    "Fleet hit ratio per model": [scalar(hit_ratio)],
    "Fleet transfer bandwidth": [keyed(bandwidth, *LINK)],
    "Hit ratio per instance": [scalar(hit_ratio)],
    "Host hit share per instance": [scalar(lambda r: hit_ratios(r)["host"])],
    "GPU tier occupancy per instance": [scalar(lambda r: occupancy(r)[("gpu",)])],
    "Host tier occupancy per instance": [scalar(lambda r: occupancy(r)[("host",)])],
    "Transfer bandwidth per instance": [scalar(lambda r: sum(bandwidth(r).values()))],
    "Onload latency p99 per instance": [scalar(lambda r: latency(0.99, ONLOAD)(r)[ONLOAD[0]])],
    "Thrash onloads per instance": [scalar(raw("kvobs_thrash_onloads_total"))],
    "Drops and failures per instance": [zero("instance"), zero("instance")],
}


def test_each_panel_equals_vllms_own_figures(run: Run) -> None:
    answers: dict[str, list[list[Series]]] = {}
    for _stem, title, expr, _gpu in run.panels:
        answers.setdefault(title, []).append(run.query(expr))
    failed = []
    for title, got in answers.items():
        checks = PANEL_CHECKS[title]
        try:
            assert len(got) == len(checks), got
            for check, series in zip(checks, got, strict=True):
                check(run, series)
        except AssertionError as exc:
            failed.append(f"{title}: {exc}")
    assert not failed, "\n".join(failed)
    # what the checks stand on: hits from both tiers, both links, thrash, a net benefit
    assert hit_ratios(run)["gpu"] > 0 and hit_ratios(run)["host"] > 0
    assert all(v > 0 for v in bandwidth(run).values()) and THRASH(run) > 0


#: Every recording rule: the same figure from vLLM's series (or kvobs's raw counters).
RULE_CHECKS: dict[str, SeriesCheck] = {
    "instance:kvobs_lookup_tokens:rate1m": keyed(lookup_rates, "outcome"),
    "instance:kvobs_lookup_hit_ratio:rate1m": keyed(hit_ratio_by_tier, "tier"),
    "instance:kvobs_lookup_miss_ratio:rate1m": scalar(lambda r: 1 - hit_ratio(r)),
    "instance:kvobs_transfer_bandwidth_bytes:rate1m": keyed(bandwidth, *LINK),
    "instance:kvobs_transfer_duration_seconds:p99_rate5m": keyed(latency(0.99, list(LINKS)),
                                                                 *LINK),
    "instance:kvobs_thrash_ratio:rate5m": scalar(ratio(THRASH, lambda r: vllm_blocks(r, LOAD))),
    "instance:kvobs_offload_waste_ratio:rate5m": scalar(
        ratio(UNUSED, lambda r: REUSED(r) + UNUSED(r))),
    "instance:kvobs_tier_occupancy:ratio": keyed(occupancy, "tier"),
    "instance:kvobs_host_pool_net_benefit_seconds:rate5m": scalar(
        lambda r: net_benefit(r, 300)),
    "instance:kvobs_reuse_hit_ratio:rate1h": whatif,
    "model:kvobs_lookup_tokens:rate1m": keyed(lookup_rates, "outcome"),
    "model:kvobs_lookup_hit_ratio:rate1m": scalar(hit_ratio),
    "model:kvobs_transfer_bandwidth_bytes:rate1m": keyed(bandwidth, *LINK),
    "model:kvobs_tier_capacity_bytes:sum": keyed(capacity_bytes, "tier"),
    "model:kvobs_tier_resident_bytes:sum": keyed(resident_bytes, "tier", "state"),
    "model:kvobs_host_pool_net_benefit_seconds:rate5m": scalar(lambda r: net_benefit(r, 300)),
    "model:kvobs_reuse_hit_ratio:rate1h": whatif,
}


def inline_group_rules(expr: str, earlier: dict[str, str]) -> str:
    """``expr`` with the series of rules evaluated before it in its group (``earlier``:
    record -> expr) replaced by their expressions, as the group's next evaluation reads
    them. Each is ``sum by (...) (instance:...)``: a selector's matchers go inside."""
    for record, definition in earlier.items():
        shape = re.fullmatch(r"(sum by \([\w, ]+\) \()(instance:\w+:\w+)\)", definition)
        if record in expr:
            assert shape, definition
            expr = re.sub(rf"{re.escape(record)}(?![\w:])(\{{[^}}]*\}})?",
                          f"({shape[1]}{shape[2]}\\1))", expr)
    return expr


def test_each_recording_rule_equals_vllms_own_figures(run: Run) -> None:
    """Each rule's expression at E against vLLM's figures: the fleet rules read the
    instance rules recorded at E (a fleet rule reading one of its own group as its next
    evaluation does); the instance rules were recorded at E, the same series."""
    failed, unchecked = [], dict(RULE_CHECKS)
    for path in sorted(run.rules_dir.glob("*.rules.yaml")):
        for group in yaml.safe_load(path.read_text())["groups"]:
            earlier: dict[str, str] = {}
            for rule in (r for r in group["rules"] if "record" in r):
                record, expr = rule["record"], rule["expr"]
                if group["name"] != PLANNED_GROUP:  # evaluated at E: read as recorded there
                    expr = inline_group_rules(expr, earlier)
                got, check = run.query(expr), unchecked.pop(record)
                earlier[record] = rule["expr"]
                try:
                    assert got and all(math.isfinite(s.samples[0][1]) for s in got), got
                    check(run, got)
                    if record.startswith("instance:"):
                        recorded = run.query(record)
                        assert {s.samples[0][0] for s in recorded} == {run.at}, recorded
                        assert {frozenset(s.labels.items()) for s in recorded} == {
                            frozenset({**s.labels, "__name__": record}.items()) for s in got}
                except AssertionError as exc:
                    failed.append(f"{record}: {exc}")
    assert not failed, "\n".join(failed)
    assert not unchecked, f"rules the files no longer have: {sorted(unchecked)}"


# -- the CLIs ---------------------------------------------------------------------------------

def test_kvobs_report_draws_the_dashboards_from_this_prometheus(run: Run, tmp_path: Path) -> None:
    stems = sorted({s for s, _t, _e, _g in run.panels})
    jobs = {stem: subprocess.Popen(
        [str(MAIN_PYTHON.parent / "kvobs"), "report", "--prometheus", run.prometheus.url,
         "--out", str(tmp_path / f"{stem}.png"), "--dashboard", stem, "--range", "5m",
         "--rate-interval", f"{run.rate_window_s}s"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for stem in stems}
    for stem, job in jobs.items():
        output, _ = job.communicate(timeout=180)
        titles = {t for s, t, _e, _g in run.panels if s == stem}
        assert job.returncode == 0, output
        assert f": {len(titles)} panels of the {stem} dashboard" in output, output
        assert (tmp_path / f"{stem}.png").stat().st_size > 10_000


def test_kvobs_top_shows_latencies_bytes_and_vllms_hit_split(run: Run) -> None:
    shown = subprocess.run(
        [str(Path(sys.executable).parent / "kvobs"), "top", "--once", "--url",
         f"http://127.0.0.1:{run.server.kvobs_port}/metrics"],
        capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "120"})
    assert shown.returncode == 0, shown.stderr
    text, duration = shown.stdout, r"\d[\d.]* (?:µs|ms|s)"
    for name in ("gpu→host", "host→gpu"):  # p50 and p99, not "-"
        assert re.search(rf" {name}\s+\S+ \S*B/s\s+\S+\s+{duration}\s+{duration}\s", text), text
    tiers = {m[0]: m[1:] for m in re.findall(
        r"│ (gpu|host)\s+\S+\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\S+ \S*B) / (\S+ \S*B)", text)}
    # in use, cached, free, capacity, bytes used / capacity bytes
    for tier, medium, blocks in (("gpu", "GPU", run.gpu_blocks), ("host", "CPU", HOST_CHUNKS)):
        cached = run.cached(medium)
        assert tiers[tier] == ("0", str(cached), str(blocks - cached), str(blocks),
                               format_value(cached * host_chunk_bytes(), "bytes"),
                               format_value(blocks * host_chunk_bytes(), "bytes")), text
    for tier, ratio_of_vllm in hit_ratios_since_start(run).items():
        assert f" {tier} {ratio_of_vllm:.0%}" in text, text


def hit_ratios_since_start(run: Run) -> dict[str, float]:
    queries = run.value("vllm:prefix_cache_queries_total")
    return {"gpu": run.value("vllm:prefix_cache_hits_total") / queries,
            "host": run.value("vllm:external_prefix_cache_hits_total") / queries}


# -- last: the end ------------------------------------------------------------------------------

def test_no_process_outlives_vllm_serve(run: Run) -> None:
    assert len(run.server.children) >= 2  # vLLM's engine core and its worker
    assert run.stop() == []
    assert run.server.process.returncode is not None
    assert run.prometheus.process.poll() is not None
    print("wall time (s):", {k: round(v) for k, v in run.timings.items()})
