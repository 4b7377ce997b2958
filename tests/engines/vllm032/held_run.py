"""A real Prometheus scraping a held engine run (shared by the net-benefit tests).

The engine script (``engine_run.py`` or ``engine_run_dp.py``) runs with
``KVOBS_TEST_HOLD_DIR``: it writes ``ready`` (with its kvobs base port) once built and
waits for ``go``, so that Prometheus's first sample of every counter is 0, and writes
``done`` after its last request and waits for ``release`` while the test reads the rules.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from tests.engines.vllm032.conftest import HERE, RUN_TIMEOUT_S, Samples
from tests.required import REPO, find_tool

T = TypeVar("T")
NET = "instance:kvobs_host_pool_net_benefit_seconds:rate5m"


@dataclass
class HeldEngine:
    """An engine script running with a hold directory, its log and its account file."""

    process: subprocess.Popen[bytes]
    hold: Path
    log: Path
    out: Path

    def wait(self, what: str, probe: Callable[[], T | None], timeout_s: float) -> T:
        """``probe()`` once it is not None; fail with the engine's log if it ends first."""
        deadline = time.monotonic() + timeout_s
        while True:
            found = probe()
            if found is not None:
                return found
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(
                    f"waiting for {what}: engine exit {self.process.poll()}\n"
                    f"{self.log.read_text(errors='replace')[-4000:]}")
            time.sleep(0.2)

    def ready(self) -> dict[str, Any]:
        """The note the engine wrote once built (its kvobs base port, ...)."""
        self.wait("the engine to start", lambda: (self.hold / "ready").exists() or None,
                  RUN_TIMEOUT_S)
        return json.loads((self.hold / "ready").read_text())  # type: ignore[no-any-return]

    def go(self) -> None:
        """Let the workload start."""
        (self.hold / "go").write_text("")

    def done(self) -> float:
        """Wait for the workload's end; the wall-clock time it was seen."""
        self.wait("the workload", lambda: (self.hold / "done").exists() or None,
                  RUN_TIMEOUT_S)
        return time.time()

    def vllm(self) -> Samples:
        """vLLM's registry as the engine script wrote it (once the process has ended)."""
        assert self.process.returncode == 0, self.log.read_text(errors="replace")[-4000:]
        return Samples(json.loads(self.out.read_text())["vllm"])

    def account(self) -> dict[str, Any]:
        """Everything the engine script wrote (once the process has ended)."""
        assert self.process.returncode == 0, self.log.read_text(errors="replace")[-4000:]
        return json.loads(self.out.read_text())  # type: ignore[no-any-return]


@contextmanager
def held_engine(script: str, args: list[str], workdir: Path,
                **env: str) -> Iterator[HeldEngine]:
    """Run ``script`` (next to this module) with kvobs enabled and a hold directory; on
    exit release it and wait for it to end."""
    hold, log, out = workdir / "hold", workdir / "engine.log", workdir / "account.json"
    hold.mkdir()
    environ = {k: v for k, v in os.environ.items() if not k.startswith("KVOBS_")}
    environ.update(KVOBS_ENABLE="1", KVOBS_LOG_FORMAT="json", KVOBS_SUMMARY_INTERVAL_S="0",
                   KVOBS_TEST_HOLD_DIR=str(hold), HF_HUB_OFFLINE="1", **env)
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [sys.executable, str(HERE / script), str(out), *args, "--workdir", str(workdir)],
            cwd=workdir, env=environ, stdout=sink, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL)
    try:
        yield HeldEngine(process, hold, log, out)
    finally:
        (hold / "release").write_text("")
        try:
            process.wait(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise


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
    """The value of ``expr``, which must have exactly one sample."""
    result = query(url, expr, at)
    assert len(result) == 1, (expr, result)
    return float(result[0]["value"][1])


@contextmanager
def prometheus(workdir: Path, targets: list[str]) -> Iterator[str]:
    """A real Prometheus scraping ``targets`` every second with kvobs's shipped recording
    rules; yields its URL and stops it on exit."""
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
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(timeout=15)


def final_net(url: str, engine: HeldEngine, done: float) -> tuple[float, list[dict[str, Any]]]:
    """The net-benefit rule's answers on the final counters (every target scraped more
    than 2 s after the workload ended), and the instant the rule computed them."""
    engine.wait("the rule evaluated on the final counters", lambda: query(
        url, f"{NET} and on () (min(timestamp(kvobs_lookups_total)) > {done + 2})") or None,
        60)
    stamps = {float(r["value"][1]) for r in query(url, f"timestamp({NET})")}
    assert len(stamps) == 1, stamps  # one evaluation computes every answer
    at = stamps.pop()  # the rule's window ends here
    return at, query(url, NET, at)
