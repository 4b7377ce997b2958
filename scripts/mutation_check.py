"""Prove the engine tests bite: every event an engine's adapters record, doubled and
dropped, must make at least one of that engine's tests fail.

Each mutant is one textual change to a copy of ``kvobs/`` (never the working tree): the
first argument of one recorder call doubled (``2 * (x)``) or zeroed (the event dropped).
The suites run from the copy's folder with the copy first on ``PYTHONPATH``, so they (and
vLLM's plugin loader in every engine process) import it instead of the repository's
kvobs; each run checks that they do. A mutant is *killed* when
a suite fails; a *survivor* is a hole in the tests. Suites run in the order given, the
first failure ends a mutant's run (``-x``).

Each engine's mutants and the suites that judge them live in ``scripts/mutants/<engine>.py``.

Usage (about 20-60 s per mutant; ``make mutants`` runs every engine)::

    python scripts/mutation_check.py                        # every engine's mutants
    python scripts/mutation_check.py --engine sglang        # one engine's
    python scripts/mutation_check.py --only reuse           # ids containing "reuse"
    python scripts/mutation_check.py --only hisparse \
        --suite .venv-vllm/bin/python:tests/engines/vllm/test_vllm_hisparse.py
    python scripts/mutation_check.py --list
    python scripts/mutation_check.py --check                # every snippet still applies

Exit status 1 when a mutant survived (or a suite failed without any mutant).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from importlib import import_module
from pathlib import Path
from types import ModuleType

from mutants.common import Mutant

REPO = Path(__file__).resolve().parents[1]
ENGINES = ("vllm", "sglang", "lmcache")
Suites = tuple[tuple[str, str], ...]


def engine_module(engine: str) -> ModuleType:
    """``scripts/mutants/<engine>.py``: its ``SUITES`` and ``mutants()``."""
    return import_module(f"mutants.{engine}")


def apply(mutant: Mutant, tree: Path) -> None:
    if mutant.new == mutant.old:
        raise SystemExit(f"mutant {mutant.id} changes nothing: fix its definition")
    target = tree / mutant.path
    text = target.read_text()
    found = text.count(mutant.old)
    if found != 1:
        raise SystemExit(f"mutant {mutant.id}: {mutant.path} holds the snippet {found} times "
                         f"(need exactly 1): update scripts/mutation_check.py\n{mutant.old!r}")
    target.write_text(text.replace(mutant.old, mutant.new, 1))


def suite_env(tree: Path) -> dict[str, str]:
    """The environment the suites run in: the mutant tree first on the path."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KVOBS_", "PYTEST_"))}
    # REPO: the tests package. The mutants edit kvobs/'s Python and run with the C extension
    # (kvobs.kernels, from the repository, unmutated) as production does: no behaviour has
    # a second implementation for a mutant to miss.
    env["PYTHONPATH"] = os.pathsep.join((str(tree), str(REPO)))
    return env


def check_isolation(tree: Path, suites: Suites) -> None:
    """Each suite's interpreter, run as the suites are (working directory = the mutant
    tree, which ``python -m`` puts first on ``sys.path``; the repository's own ``kvobs/``
    would shadow the mutant from there), must import the mutant's kvobs."""
    for python, _suite in suites:
        found = subprocess.run([str(REPO / python), "-c", "import kvobs; print(kvobs.__file__)"],
                               cwd=tree, env=suite_env(tree), capture_output=True, text=True,
                               check=True).stdout.strip()
        if not found.startswith(str(tree)):
            raise SystemExit(f"{python} imports kvobs from {found}, not the mutant in {tree}")


def run_suites(tree: Path, suites: Suites, timeout: int,
               markers: str = "") -> tuple[bool, str]:
    """Whether every suite passed with the mutant tree's kvobs; else where it failed
    (``markers``: only the tests that expression selects, as ``pytest -m``)."""
    for python, suite in suites:
        proc = subprocess.run(
            [str(REPO / python), "-m", "pytest", str(REPO / suite), "-x", "-q",
             *(("-m", markers) if markers else ()),
             "-p", "no:cacheprovider", "-W", "ignore::DeprecationWarning",
             "-k", "not broken_kvobs", f"--rootdir={REPO}",
             # pyproject's pythonpath (".": the repository) would put the repository's
             # kvobs before the mutant's; PYTHONPATH gives the tests package instead
             "-o", "pythonpath="],
            cwd=tree, env=suite_env(tree), capture_output=True, text=True, timeout=timeout,
            check=False)
        if proc.returncode != 0:
            failed = [line for line in proc.stdout.splitlines() if line.startswith("FAILED")]
            return False, f"{suite}: {failed[0] if failed else proc.stdout[-300:]}"
    return True, ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=ENGINES, action="append",
                        help="this engine's mutants (repeatable; default: every engine)")
    parser.add_argument("--only", default="", help="run mutants whose id contains this")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    parser.add_argument("--check", action="store_true",
                        help="check that every mutant's snippet is in its file once, and exit")
    parser.add_argument("--timeout", type=int, default=900, help="seconds per suite run")
    parser.add_argument("-m", dest="markers", default="", metavar="EXPR",
                        help='only the tests pytest -m EXPR selects (e.g. "not timing": '
                             "a mutant killed by a wall-clock test alone is a loose kill)")
    parser.add_argument("--suite", action="append", metavar="PYTHON:PATH",
                        help="judge by this suite instead of the engine's (repeatable; a "
                             "quicker check of mutants one test file kills)")
    args = parser.parse_args()
    chosen = tuple(tuple(s.split(":", 1)) for s in args.suite or ())
    if any(len(pair) != 2 for pair in chosen):
        parser.error("--suite: give PYTHON:PATH, e.g. .venv-vllm/bin/python:tests/engines/vllm")
    plan = [(m, chosen or module.SUITES) for module in map(engine_module, args.engine or ENGINES)
            for m in module.mutants() if args.only in m.id]
    if args.list:
        print("\n".join(f"{m.id:45} {m.path}" for m, _suites in plan))
        return 0
    if args.check:
        stale = [f"{m.id}: {m.path} holds its snippet {(REPO / m.path).read_text().count(m.old)} "
                 "times (need 1)" for m, _suites in plan
                 if (REPO / m.path).read_text().count(m.old) != 1]
        print("\n".join(stale) or f"{len(plan)} mutants, every snippet found once")
        return 1 if stale else 0
    for python in sorted({python for _m, suites in plan for python, _suite in suites}):
        if not (REPO / python).exists():
            raise SystemExit(f"{python} is missing: run `bash scripts/deps/engines.sh`")
    survivors = []
    with tempfile.TemporaryDirectory(prefix="kvobs-mutants-") as scratch:
        for n, (mutant, suites) in enumerate(plan, 1):
            tree = Path(scratch) / mutant.id.replace(":", "-").replace("(", "").replace(")", "")
            shutil.copytree(REPO / "kvobs", tree / "kvobs",
                            ignore=shutil.ignore_patterns("__pycache__"))
            apply(mutant, tree)
            check_isolation(tree, suites)
            started = time.monotonic()
            passed, where = run_suites(tree, suites, args.timeout, args.markers)
            verdict = "SURVIVED" if passed else "killed"
            print(f"[{n}/{len(plan)}] {mutant.id:45} {verdict:8} "
                  f"{time.monotonic() - started:5.0f} s  {where}", flush=True)
            if passed:
                survivors.append(mutant.id)
            shutil.rmtree(tree)
    print(f"mutants: {len(plan)}, killed: {len(plan) - len(survivors)}, "
          f"survived: {len(survivors)} {survivors if survivors else ''}")
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main())
