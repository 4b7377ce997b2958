"""Runs the real vLLM engine (CPU build) once per executor and shares its accounts.

Each engine runs in a process of its own (``engine_run.py``): vLLM's Prometheus registry
and kvobs's plugin state are process-wide, and the multi-process engine's children must
be gone when it ends. It runs from a scratch directory: a ``kvobs`` folder in the working
directory would shadow the installed package in vLLM's plugin loader.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.fleet.publisher_checks import engines  # noqa: F401 (a fixture: test_fleet_events)

HERE = Path(__file__).resolve().parent
RUN_TIMEOUT_S = 240


@dataclass(frozen=True)
class Samples:
    """Samples of one Prometheus scrape or registry: ``[name, labels, value]``."""

    rows: list[list[Any]]

    def total(self, name: str, **labels: str) -> float:
        """Sum of ``name``'s samples whose labels include ``labels``."""
        return sum(value for sample, got, value in self.rows
                   if sample == name and all(got.get(k) == v for k, v in labels.items()))

    def has(self, name: str, **labels: str) -> bool:
        """Whether any sample of ``name`` carries ``labels``."""
        return any(sample == name and all(got.get(k) == v for k, v in labels.items())
                   for sample, got, _ in self.rows)

    def label_sets(self, prefix: str) -> set[frozenset[str]]:
        """The label names on samples whose name starts with ``prefix``, less the
        metric's own labels (tier, state, outcome, ...) which the caller strips."""
        return {frozenset(got) for sample, got, _ in self.rows if sample.startswith(prefix)}


@dataclass(frozen=True)
class EngineRun:
    """Every account of one engine run (see ``engine_run.py``) and its log."""

    mode: str
    account: dict[str, Any]
    log: str

    @property
    def vllm(self) -> Samples:
        return Samples(self.account["vllm"])

    @property
    def kvobs(self) -> Samples:
        return Samples(self.account["kvobs"])

    @property
    def events(self) -> dict[str, int]:
        return self.account["events"]

    def request(self, request_id: str) -> dict[str, Any]:
        return next(r for r in self.account["requests"] if r["id"] == request_id)

    def log_events(self, event: str) -> list[dict[str, Any]]:
        """kvobs's structlog events (JSON lines) named ``event``, from every process."""
        found = []
        for line in self.log.splitlines():
            start = line.find('{"')
            if start < 0 or f'"event": "{event}"' not in line:
                continue
            found.append(json.loads(line[start:]))
        return found


def run_engine(mode: str, workdir: Path, **env: str) -> EngineRun:
    """Run ``engine_run.py`` in ``mode`` with kvobs enabled; fail with its log's tail."""
    out, log = workdir / "account.json", workdir / "engine.log"
    environ = {k: v for k, v in os.environ.items() if not k.startswith("KVOBS_")}
    # Every step is compared with vLLM's registry at once: each scrape must collect
    # (the default serves one collection to the scrapes of 0.25 s).
    environ.update({"KVOBS_ENABLE": "1", "KVOBS_LOG_FORMAT": "json",
                    "KVOBS_SUMMARY_INTERVAL_S": "0", "KVOBS_METRICS_MIN_INTERVAL_S": "0",
                    "HF_HUB_OFFLINE": "1", **env})
    with log.open("w") as sink:
        proc = subprocess.run(
            [sys.executable, str(HERE / "engine_run.py"), str(out), "--mode", mode,
             "--workdir", str(workdir)],
            cwd=workdir, env=environ, stdout=sink, stderr=subprocess.STDOUT,
            timeout=RUN_TIMEOUT_S, check=False)
    text = log.read_text(errors="replace")
    assert proc.returncode == 0, f"engine run ({mode}) failed:\n{text[-6000:]}"
    account = json.loads(out.read_text())
    for stall in account.get("scrape_stalls", ()):  # answered at the second try
        threads = "\n".join(f"--- {name}\n{stack}" for name, stack in stall["stacks"].items())
        warnings.warn(f"engine run ({mode}): a scrape of {stall['url']} took over 10 s; "
                      f"threads then:\n{threads}", stacklevel=1)
    return EngineRun(mode, account, text)


@pytest.fixture(scope="session")
def engine_runs(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], EngineRun]:
    """``runs(mode)``: the engine run of ``mode``, run once per session."""
    done: dict[str, EngineRun] = {}

    def runs(mode: str) -> EngineRun:
        if mode not in done:
            done[mode] = run_engine(mode, tmp_path_factory.mktemp(f"vllm-{mode}"))
        return done[mode]

    return runs


@pytest.fixture(scope="session", params=["single", "multi"])
def engine(request: pytest.FixtureRequest,
           engine_runs: Callable[[str], EngineRun]) -> EngineRun:
    """A real engine run per executor: single-process, and vLLM's default multi-process
    one (an engine-core and a worker process)."""
    return engine_runs(request.param)


@pytest.fixture
def single(engine_runs: Callable[[str], EngineRun]) -> EngineRun:
    """The single-process run (kvobs and vLLM were read after every step)."""
    return engine_runs("single")
