"""What kvobs adds to a real vLLM 0.33 scheduler step, counted under cachegrind.

The timed A/B (:mod:`benchmarks.vllm_scheduler_overhead`) is the figure the goal is
stated in; on a small shared machine its sets of schedulers disagree by more than the
72-request goal itself. This benchmark counts instead: the same workload under valgrind's
cachegrind, per step, the instructions executed and the simulated first-level and
last-level cache misses of a plain scheduler, of one instrumented as the plugin does
(reuse profile, decode-written blocks, step timing, every hook), and of a second plain
one, the control. The control runs unless ``--no-control``, because the counts are not
repeatable between processes: a plain scheduler's step differs from another plain
one's by 0.6-1.1% in instructions and 1.3-2.1% in estimated cycles at 72 running
requests, almost all of it in CPython's type attribute cache and dict lookups (type
version tags and name addresses, which decide its collisions, differ between
processes), and turning address randomisation off (``setarch -R``) did not change that.
So the counts say what the clock says, with their own noise beside them: kvobs's added
work, not a precise ratio. ``--bytecodes`` of the timed benchmark is the count that
repeats exactly (kvobs's own Python per step).

How: six child processes (four with ``--no-control``), each under ``valgrind
--tool=cachegrind --cache-sim=yes``, two at a time. Each builds one scheduler (the test
bed of the timed benchmark: the ``OffloadingConnector`` with CPU offloading,
``--running`` requests with shared prefixes), runs ``--warmup`` steps (past step
timing's warm-up), then ``0`` or ``--measure`` more with the garbage collector off (as
the timed A/B runs its rounds: one full collection of the engine's heap outweighs what a
step's hooks do), and exits at once. Per step = (counts after ``--measure`` - counts
after 0) / ``--measure``: the start-up, the imports and the warm-up cancel out.
``PYTHONHASHSEED=0`` makes the block hashes, and so the steps, the same in every child
(all three schedule the same tokens, hit the same blocks and offload the same bytes);
``PYTHONMALLOC=malloc`` is what valgrind needs to see Python's allocations; one BLAS /
OpenMP thread, so no idle thread spins inside the count.

The last level simulated is, by default, one core's 1 MiB second-level cache
(``--ll 1048576,8,64``): a miss there goes to the third level, shared with the other
cores (and, on a cloud VM, with other tenants) or to memory, which is where an
instrumented step pays for data the engine's own work pushed out between two hooks.
Valgrind's own pick (``--ll host``) follows the CPU's report, which on this VM reads the
third level as 384 MB (simulated as 512 MB): nothing ever misses it. The estimated cycles
are KCachegrind's estimate: instructions + 10 x first-level misses + 100 x last-level
misses, a model (no branch mispredictions, no out-of-order overlap, two cache levels),
not a clock. ``--keep DIR`` keeps the per-function files: ``cg_diff`` of a child's 0-step
and N-step files is its steps, and ``cg_diff`` of two such differences puts the added
instructions and misses on C functions (the interpreter's, kvobs's extension's).

Run from the repository root with the vLLM venv and valgrind installed (about 15 minutes
at 72 running requests on two idle cores)::

    .venv-vllm/bin/python -m benchmarks.vllm_scheduler_counts              # table
    .venv-vllm/bin/python -m benchmarks.vllm_scheduler_counts --json
    .venv-vllm/bin/python -m benchmarks.vllm_scheduler_counts --running 8
    .venv-vllm/bin/python -m benchmarks.vllm_scheduler_counts --keep /tmp/cg  # + cg_diff
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

#: cachegrind's summary lines (stderr) -> our field names
_SUMMARY = {"I   refs": "instructions", "I1  misses": "i1_misses", "LLi misses": "lli_misses",
            "D   refs": "data_refs", "D1  misses": "d1_misses", "LLd misses": "lld_misses"}
_LINE = re.compile(r"^==\d+== (" + "|".join(re.escape(k) for k in _SUMMARY)
                   + r"):\s+([\d,]+)", re.M)
MODES = ("plain", "kvobs")
#: the control: a second plain scheduler in processes of its own (plain vs plain;
#: ``--no-control`` skips it)
CONTROL = "control"


@dataclass(frozen=True)
class Counts:
    """cachegrind's totals for one process (or their difference, per step)."""

    instructions: float
    data_refs: float
    i1_misses: float
    d1_misses: float
    lli_misses: float
    lld_misses: float

    @property
    def l1_misses(self) -> float:
        return self.i1_misses + self.d1_misses

    @property
    def ll_misses(self) -> float:
        return self.lli_misses + self.lld_misses

    @property
    def cycles(self) -> float:
        """KCachegrind's cycle estimate: Ir + 10 x L1 misses + 100 x LL misses."""
        return self.instructions + 10 * self.l1_misses + 100 * self.ll_misses

    def per_step(self, start: Counts, steps: int) -> Counts:
        """``(self - start) / steps``, field by field."""
        return Counts(*((getattr(self, f) - getattr(start, f)) / steps
                        for f in Counts.__dataclass_fields__))


def parse_summary(text: str) -> Counts:
    """The totals of a cachegrind run from its stderr summary.

    >>> parse_summary("==7== I   refs:      1,000\\n==7== I1  misses:  10\\n"
    ...               "==7== LLi misses: 1\\n==7== D   refs: 400 (300 rd + 100 wr)\\n"
    ...               "==7== D1  misses: 20 (15 rd + 5 wr)\\n==7== LLd misses: 2 (2 rd + 0 wr)\\n"
    ...               ).cycles
    1600.0
    """
    found = {_SUMMARY[name]: float(value.replace(",", "")) for name, value in _LINE.findall(text)}
    missing = sorted(set(_SUMMARY.values()) - set(found))
    if missing:
        raise RuntimeError(f"cachegrind's summary lacks {', '.join(missing)} (was the run "
                           "made with --cache-sim=yes?); its output ended:\n" + text[-2000:])
    return Counts(**found)


def child(mode: str, running: int, warmup: int, steps: int) -> None:
    """One scheduler, ``warmup`` then ``steps`` steps (what runs under valgrind); exits
    right after them, so no run pays for tearing down what its steps built."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    from benchmarks.vllm_scheduler_overhead import build

    torch.set_num_threads(1)
    tmp = tempfile.mkdtemp(prefix="kvobs-counts-")
    workload, _ = build(Path(tmp), mode, running, instrumented=mode == "kvobs")
    workload.steps(warmup)
    # The collector off for the counted steps, as in the timed A/B: where a collection
    # falls depends on every allocation before it (kvobs's too), and one full collection
    # of the engine's heap outweighs what a step's hooks do.
    gc.collect()
    gc.disable()
    workload.steps(steps)
    sys.stdout.flush()
    shutil.rmtree(tmp, ignore_errors=True)
    os._exit(0)


@dataclass(frozen=True)
class Cachegrind:
    """How each child runs under valgrind: the binary, the simulated last level
    (valgrind's ``--LL``: ``size,assoc,line``; None: valgrind's own pick) and where to
    keep the per-function output files (None: not kept)."""

    valgrind: str
    last_level: str | None = None
    keep: Path | None = None

    def command(self, mode: str, steps: int) -> list[str]:
        out = self.keep / f"{mode}-{steps}.out" if self.keep else "/dev/null"
        return [self.valgrind, "--tool=cachegrind", "--cache-sim=yes",
                *([f"--LL={self.last_level}"] if self.last_level else []),
                f"--cachegrind-out-file={out}"]


def counted(mode: str, running: int, warmup: int, steps: int, tool: Cachegrind) -> Counts:
    """cachegrind's totals for :func:`child` (a process of its own)."""
    env = dict(os.environ, PYTHONHASHSEED="0", PYTHONMALLOC="malloc",
               # no idle BLAS / OpenMP threads: their spinning counts as the process's work
               OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    command = [*tool.command(mode, steps), sys.executable, "-m",
               "benchmarks.vllm_scheduler_counts", "--child", mode, "--running", str(running),
               "--warmup", str(warmup), "--measure", str(steps)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"{mode} ({steps} steps) under cachegrind exited "
                           f"{done.returncode}:\n{done.stderr[-2000:]}")
    return parse_summary(done.stderr)


def step_counts(running: int, warmup: int, steps: int, tool: Cachegrind,
                jobs: int = 2, control: bool = False) -> dict[str, Counts]:
    """Per-step counts of the plain and the instrumented scheduler (and, with
    ``control``, of a second plain one: how far two identical runs' counts differ)."""
    modes = (*MODES, CONTROL) if control else MODES
    runs = [(mode, n) for mode in modes for n in (0, steps)]
    with ThreadPoolExecutor(jobs) as pool:
        totals = dict(zip(runs, pool.map(
            lambda run: counted(run[0], running, warmup, run[1], tool), runs), strict=True))
    return {mode: totals[(mode, steps)].per_step(totals[(mode, 0)], steps) for mode in modes}


def report(per_step: dict[str, Counts], running: int) -> dict[str, object]:
    plain, kvobs = per_step["plain"], per_step["kvobs"]
    out: dict[str, object] = {"running_requests": running}
    for field in ("instructions", "data_refs", "l1_misses", "ll_misses", "cycles"):
        p, k = getattr(plain, field), getattr(kvobs, field)
        row: dict[str, object] = {"plain": round(p), "kvobs": round(k), "added": round(k - p),
                                  "ratio": round(k / p, 4) if p else None}
        if CONTROL in per_step:
            c = getattr(per_step[CONTROL], field)
            row["control_added"] = round(c - p)
        out[field] = row
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--running", type=int, default=72, help="requests kept in the engine")
    parser.add_argument("--warmup", type=int, default=1100,
                        help="steps before counting (past step timing's warm-up)")
    parser.add_argument("--measure", type=int, default=300, help="steps counted")
    parser.add_argument("--jobs", type=int, default=2, help="children under valgrind at once")
    parser.add_argument("--no-control", dest="control", action="store_false",
                        help="skip the second plain scheduler (plain vs plain, how far two "
                             "identical runs' counts differ: a third of the run time)")
    parser.add_argument("--ll", metavar="SIZE,ASSOC,LINE", default="1048576,8,64",
                        help="the simulated last-level cache (valgrind's --LL; default: one "
                             "core's 1 MiB second-level cache, what a core has to itself "
                             "where the third level is shared; 'host': valgrind's reading "
                             "of the host's last level)")
    parser.add_argument("--keep", type=Path, metavar="DIR",
                        help="keep cachegrind's per-function files there (<mode>-<steps>.out; "
                             "compare with cg_diff, read with cg_annotate)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--child", choices=(*MODES, CONTROL), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.child, args.running, args.warmup, args.measure)
        return 0
    if args.measure < 1 or args.warmup < 0:
        parser.error("--measure must be >= 1 and --warmup >= 0")
    last_level = None if args.ll == "host" else args.ll
    if last_level is not None and not re.fullmatch(r"\d+,\d+,\d+", last_level):
        parser.error(f"--ll {args.ll!r}: give SIZE,ASSOC,LINE in bytes (e.g. 1048576,8,64) "
                     "or 'host'")
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        print("vllm_scheduler_counts: valgrind is not installed (Debian: apt-get install "
              "valgrind)", file=sys.stderr)
        return 2
    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=True)
    tool = Cachegrind(valgrind, last_level, args.keep.resolve() if args.keep else None)
    result = report(step_counts(args.running, args.warmup, args.measure, tool, args.jobs,
                                args.control), args.running)
    result["last_level_cache"] = args.ll
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"per scheduler step under cachegrind, {args.running} running requests "
          f"({args.measure} steps after {args.warmup}; last level {args.ll}):")
    control = " plain vs plain" if args.control else ""
    print(f"{'':22s} {'plain':>12s} {'kvobs':>12s} {'added':>10s} {'ratio':>7s}{control}")
    for field, label in (("instructions", "instructions"), ("data_refs", "data references"),
                         ("l1_misses", "L1 misses"), ("ll_misses", "LL misses"),
                         ("cycles", "estimated cycles")):
        row = result[field]
        assert isinstance(row, dict)
        ratio = f"{row['ratio']:.4f}x" if row["ratio"] is not None else "-"
        noise = f" {row['control_added']:+14,d}" if "control_added" in row else ""
        print(f"{label:22s} {row['plain']:12,d} {row['kvobs']:12,d} {row['added']:+10,d} "
              f"{ratio:>7s}{noise}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
