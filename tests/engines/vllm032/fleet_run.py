"""Two ``vllm serve`` replicas behind a small router, and ``kvobs fleet`` following their KV
events, for ``test_fleet_serve.py``.

* **The replicas**: vLLM's own ``vllm serve`` on the tiny model (``serve_run.start_server``)
  with prefix caching, a GPU pool of :data:`GPU_BLOCKS` (room for every chat: nothing is
  evicted, so what routing changes is all there is to see), the host tier, KV events with
  a replay endpoint, and no kvobs plugin: the fleet view reads only the events.
* **The workload**: :data:`TENANTS` system prompts shared by :data:`CHATS` chats (chat
  ``c`` belongs to tenant ``c % TENANTS``), :data:`TURNS` turns each, every turn resending
  the chat's history with a new user message; one request at a time, so that both runs
  send the same prompts in the same order (greedy replies: both replicas answer alike).
* **The requests** ask vLLM to publish their prefix hits too (``kv_cache_report_mode``
  ``full``), which the pooled what-if reads (``kvobs fleet --pooled-capacity``).
* **The router**: ``round_robin`` sends request ``k`` to replica ``k % 2``; ``prefix``
  sends a prompt to the replica that got its system prompt first, a new system prompt to
  the replica with fewer of them (prefix affinity, as cache-aware routers do).
* **The run**: one ``kvobs fleet`` process (the main venv's installed command) follows
  both replicas throughout; each routing gets a fresh pair of replicas on the same ports,
  started once the fleet read the last pair down (its liveness probe: their blocks are
  dropped then), and the fleet sees each replica restart. For each routing: vLLM's own counters
  (``/metrics``) before and after, the fleet's ``/metrics`` before and after, and every KV
  event each replica published, read by a subscriber of the test's own
  (``engine_run.EventLog``). A real Prometheus scrapes the fleet every second; at the end of
  the round-robin run every dashboard panel ``kvobs fleet`` feeds is asked of it.
"""

from __future__ import annotations

import json
import random
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvobs.report.prometheus_api import PrometheusClient
from tests.e2e.e2e_servers import start_prometheus
from tests.engines.vllm032.chat_tokenizer import words
from tests.engines.vllm032.engine_run import EventLog, free_port
from tests.engines.vllm032.serve_run import REPO, Server, http_json, start_server
from tests.fleet.scrape import scrape, wait_for
from tests.required import find_tool

MAIN_PYTHON = REPO / ".venv" / "bin" / "python"
GPU_BLOCKS = 128
#: The fleet's GPU blocks: both replicas' usable ones (vLLM's null block aside).
POOLED = len(("a", "b")) * (GPU_BLOCKS - 1)
TENANTS, CHATS, TURNS = 3, 7, 5
SYSTEM_WORDS = 64
REPLICAS = ("a", "b")
ROUTINGS = ("round_robin", "prefix")

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


@dataclass
class Routed:
    """What one routing's run produced."""

    routing: str
    vllm_before: list[Samples]
    vllm_after: list[Samples]
    fleet_before: Samples
    fleet_after: Samples
    events: list[list[dict[str, Any]]]       # per replica, every event in arrival order
    sent: list[int] = field(default_factory=list)  # the replica of each request, in order

    def vllm_delta(self, name: str) -> float:
        return sum(_total(after, name) - _total(before, name)
                   for before, after in zip(self.vllm_before, self.vllm_after, strict=True))

    def fleet_delta(self, name: str, **labels: str) -> float:
        return _total(self.fleet_after, name, **labels) - \
            _total(self.fleet_before, name, **labels)

    @property
    def hit_ratio(self) -> float:
        """vLLM's own prefix-cache hit ratio over the run: GPU and connector hits over
        queried tokens, summed over the replicas."""
        hits = self.vllm_delta("vllm:prefix_cache_hits_total") + \
            self.vllm_delta("vllm:external_prefix_cache_hits_total")
        return hits / self.vllm_delta("vllm:prefix_cache_queries_total")


def _total(samples: Samples, name: str, **labels: str) -> float:
    return sum(v for (n, got), v in samples.items() if n == name and
               set(labels.items()) <= got)


class Router:
    """Sends each chat request to a replica by the routing's rule."""

    def __init__(self, routing: str, servers: list[Server]) -> None:
        self.routing, self.servers = routing, servers
        self.sent: list[int] = []
        self._prefix_home: dict[str, int] = {}

    def choose(self, messages: list[dict[str, str]]) -> int:
        if self.routing == "round_robin":
            return len(self.sent) % len(self.servers)
        system = messages[0]["content"]
        if system not in self._prefix_home:
            homes = list(self._prefix_home.values())
            self._prefix_home[system] = min(range(len(self.servers)), key=homes.count)
        return self._prefix_home[system]

    def ask(self, messages: list[dict[str, str]], max_tokens: int) -> str:
        replica = self.choose(messages)
        self.sent.append(replica)
        answer = http_json(f"{self.servers[replica].url}/v1/chat/completions", {
            "model": "tiny", "messages": messages, "max_tokens": max_tokens,
            "temperature": 0.0, "ignore_eos": True,
            # each request also publishes its prefix hits (the pooled what-if's references)
            "vllm_xargs": {"kv_cache_report_mode": "full"}})
        return str(answer["choices"][0]["message"]["content"])


def chat_workload(router: Router, seed: int = 0) -> None:
    """Every chat's turns, interleaved (turn by turn), one request at a time."""
    rnd = random.Random(seed)
    systems = [words(rnd, SYSTEM_WORDS) for _ in range(TENANTS)]
    histories = [[{"role": "system", "content": systems[c % TENANTS]}] for c in range(CHATS)]
    for _turn in range(TURNS):
        for history in histories:
            history.append({"role": "user", "content": words(rnd, rnd.randrange(12, 24))})
            reply = router.ask(history, rnd.randrange(4, 9))
            history.append({"role": "assistant", "content": reply})


def settle(events: list[EventLog], fleet_url: str, quiet_s: float = 1.5,
           limit_s: float = 30.0) -> Samples:
    """The fleet's scrape once neither the replicas' events nor its batch count moved for
    ``quiet_s`` seconds."""
    deadline = time.monotonic() + limit_s
    last: tuple[float, ...] = ()
    stable_since = time.monotonic()
    while time.monotonic() < deadline:
        for log in events:
            log.settle(quiet_s=0.5, limit_s=5)
        samples = scrape(fleet_url)
        now = (*(log.batches for log in events),
               _total(samples, "kvobs_fleet_event_batches_total"))
        if now != last:
            last, stable_since = now, time.monotonic()
        elif time.monotonic() - stable_since >= quiet_s:
            return samples
        time.sleep(0.2)
    raise AssertionError("the fleet's batch count never settled")


#: Renders the dashboards' panels fed by ``kvobs fleet`` in the main venv (grafanalib is
#: not in vLLM's): ``[[dashboard, title, expr], ...]``.
FLEET_PANELS = """
import json
import tests.e2e.test_e2e_stack as stack
stack.RATE_INTERVAL = "10m"
print(json.dumps(stack.panel_queries(fleet=True)))
"""


@dataclass
class Panels:
    """Each fleet panel query's answer from a real Prometheus scraping ``kvobs fleet``."""

    answers: list[tuple[str, str, str, list[Any]]]   # dashboard, title, expr, series


def run(workdir: Path) -> tuple[list[Routed], Panels]:
    """Both routings, with one ``kvobs fleet`` following the replicas throughout and a
    Prometheus scraping it every second; then every fleet panel query, asked of it."""
    ports = [(free_port(), free_port()) for _ in REPLICAS]
    fleet_port = free_port()
    fleet_url = f"http://127.0.0.1:{fleet_port}/metrics"
    command = [str(MAIN_PYTHON), "-m", "kvobs", "fleet", "--model", "tiny",
               "--metrics-addr", f"127.0.0.1:{fleet_port}", "--probe-interval", "1",
               "--pooled-capacity", str(POOLED)]
    for name, (events, replay) in zip(REPLICAS, ports, strict=True):
        command += ["--engine",
                    f"{name}=tcp://127.0.0.1:{events},replay=tcp://127.0.0.1:{replay},topic=kv"]
    fleet_log = workdir / "kvobs-fleet.log"
    with fleet_log.open("wb") as sink:
        fleet = subprocess.Popen(command, cwd=workdir, stdout=sink, stderr=subprocess.STDOUT)
    prometheus = start_prometheus(find_tool("prometheus", "scripts/deps/prometheus.sh"),
                                  workdir, [f"127.0.0.1:{fleet_port}"], [])
    runs: list[Routed] = []
    panels: Panels | None = None
    try:
        for routing in ROUTINGS:
            routed, answers = _routed(workdir, routing, ports, fleet_url, prometheus.url)
            runs.append(routed)
            panels = panels or answers
            wait_for(fleet_url, lambda s: _total(s, "kvobs_fleet_publisher_up") == 0, 30)
    finally:
        fleet.terminate()
        fleet.wait(timeout=30)
        prometheus.stop()
    assert panels is not None
    return runs, panels


def fleet_panels(prometheus_url: str) -> Panels:
    """Every fleet panel query at the end of the round-robin run (10 minute windows: the run
    fits), once Prometheus scraped the settled fleet twice."""
    rendered = subprocess.run([str(MAIN_PYTHON), "-c", FLEET_PANELS], cwd=REPO, check=True,
                              capture_output=True, text=True).stdout
    time.sleep(2.5)
    client = PrometheusClient(prometheus_url, timeout_s=30)
    return Panels([(stem, title, expr, client.query(expr))
                   for stem, title, expr in json.loads(rendered)])


def _routed(workdir: Path, routing: str, ports: list[tuple[int, int]], fleet_url: str,
            prometheus_url: str) -> tuple[Routed, Panels | None]:
    """One routing's run on a fresh pair of replicas; after the round-robin one, the fleet
    panels' answers (before the replicas stop: a stopped replica holds nothing)."""
    servers = [start_server(workdir / f"{routing}-{name}", f"tcp://*:{events}", plugin=False,
                            replay_endpoint=f"tcp://*:{replay}", gpu_blocks=GPU_BLOCKS,
                            max_num_seqs=1)
               for name, (events, replay) in zip(REPLICAS, ports, strict=True)]
    logs: list[EventLog] = []
    try:
        for server in servers:
            server.wait_ready()
        logs = [EventLog(f"tcp://127.0.0.1:{events}") for events, _ in ports]
        time.sleep(1.0)  # the subscriptions reach the publishers
        fleet_before = settle(logs, fleet_url)
        vllm_before = [scrape(f"{server.url}/metrics") for server in servers]
        router = Router(routing, servers)
        chat_workload(router)
        fleet_after = settle(logs, fleet_url)
        vllm_after = [scrape(f"{server.url}/metrics") for server in servers]
        panels = fleet_panels(prometheus_url) if routing == ROUTINGS[0] else None
        return Routed(routing, vllm_before, vllm_after, fleet_before, fleet_after,
                      [log.details for log in logs], router.sent), panels
    finally:
        for log in logs:
            log.close()
        for server in servers:
            server.stop()
