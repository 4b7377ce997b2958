"""Cost of kvobs in a real vLLM 0.33 scheduler loop, and of one scrape, side by side.

1. Step time: two real ``Scheduler``s with the ``OffloadingConnector`` (prefix caching,
   CPU offloading, transfers completing two steps later), driven with the same
   deterministic workload of ``--running`` requests (shared prefixes, finished requests
   replaced at once); one is instrumented by ``instrument_scheduler`` (what the plugin
   does: block hashes and decode-written blocks into the reuse-distance profile and step
   timing for the measured prefill cost included, as by default), one the same without
   step timing, one is not instrumented, and a fourth plain one is the noise gauge
   (plain vs plain). Besides the ratios, the added microseconds per step are the median
   over rounds of the paired difference (instrumented - plain).
   Rounds of a few steps rotate the order between them so drift hits all alike, over
   ``--blocks`` fresh sets of the four, each built in another order (where a scheduler
   lands in memory moves its step time by up to ~1.5%), after a warm-up past step
   timing's first 4,096 steps (1 in 4 timed until a cost is measured, at most 1,024
   timed steps, then its steady 1 in 32); only
   the time inside ``schedule()`` and ``update_from_output()`` is counted (the
   synthetic worker is not), as this thread's CPU time (``--wall`` for wall time), which
   other processes on a shared machine disturb less. The ratio is the median over rounds
   of instrumented / plain step time (goal: <= 10 us added per step at 8 running requests,
   <= 1.01x at 72), with the ratio of totals and the control's ratio beside it.
   ``--readers`` instead times each adapter reader in place (a ``perf_counter_ns`` shim
   around every before / after function, less an empty shim's own time) in one
   instrumented scheduler: microseconds per call and per step, to see where the added
   time goes. In place a reader costs several times what it does in a warm loop: the
   engine's step evicts kvobs's objects from the caches between two calls.
   ``--methods`` times every wrapped engine method in place in three schedulers driven
   alike (plain, instrumented, and instrumented with no-op readers): the added time per
   method and per step, steadier than the step A/B (sums of microseconds, not
   differences of milliseconds), and the floor that wrapping alone costs. It misses what
   kvobs costs outside the wrapped methods (engine data evicted by kvobs's), which only
   the step A/B sees.
   ``--bytecodes`` counts instead of timing: every kvobs Python function an
   instrumented scheduler runs (wrappers and readers), its calls and bytecodes per step,
   with an opcode tracer (the same figures on any machine, however loaded).
2. Scrape: ``rec.snapshot()`` of a ``BlockPool`` of 100k GPU blocks (the settle walk over
   every block), with the pool half in use and half of its blocks holding prefix hashes,
   state set through vLLM's own calls (goal <= 5 ms).

Run from the repository root with the vLLM venv (``bash scripts/deps/engines.sh vllm``),
as a module (it drives the real-loop test bed, ``tests.engines.vllm.vllm_engine``)::

    .venv-vllm/bin/python -m benchmarks.vllm_scheduler_overhead          # table
    .venv-vllm/bin/python -m benchmarks.vllm_scheduler_overhead --json   # one JSON object
    .venv-vllm/bin/python -m benchmarks.vllm_scheduler_overhead --running 8 --rounds 300
    .venv-vllm/bin/python -m benchmarks.vllm_scheduler_overhead --bytecodes --rounds 30
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import inspect
import json
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

from kvobs.adapters import _hooks
from kvobs.adapters.vllm import instrument_block_pool, instrument_scheduler
from kvobs.adapters.vllm.steps import EVERY, MAX_WARM
from kvobs.recorder import Recorder
from tests.engines.vllm.vllm_engine import EngineDriver, build_scheduler

CHUNK_BYTES = 16384  # one block of the test model (2 layers, fp16)


class Workload:
    """Keeps ``running`` requests in one scheduler; identical for every seed-alike copy."""

    def __init__(self, driver: EngineDriver, running: int, seed: int = 0) -> None:
        self.driver = driver
        self.running = running
        self.rnd = random.Random(seed)
        self.prefixes = [[self.rnd.randrange(1000) for _ in range(64)] for _ in range(8)]
        self.added = 0
        self.top_up()

    def top_up(self) -> None:
        scheduler = self.driver.scheduler
        while len(scheduler.running) + len(scheduler.waiting) < self.running:
            prompt = self.rnd.choice(self.prefixes) + [
                self.rnd.randrange(1000) for _ in range(self.rnd.randrange(16, 96))]
            self.driver.add(f"req-{self.added}", prompt, max_tokens=self.rnd.randrange(16, 96))
            self.added += 1

    def steps(self, n: int, cpu: bool = True) -> float:
        """Run ``n`` steps; seconds spent inside the scheduler (this thread's CPU time, or
        wall time with ``cpu=False``)."""
        field = "scheduler_cpu_seconds" if cpu else "scheduler_seconds"
        before = getattr(self.driver, field)
        for _ in range(n):
            self.driver.step()
            self.top_up()
        return float(getattr(self.driver, field) - before)


#: Extra ``Recorder`` options of every instrumented scheduler (``--no-profile``).
RECORDER_OPTIONS: dict[str, Any] = {}
#: Extra ``build_scheduler`` options of every scheduler (``--async-scheduling``).
SCHEDULER_OPTIONS: dict[str, Any] = {}


def build(tmp: Path, name: str, running: int, instrumented: bool,
          steps: bool = True) -> tuple[Workload, Any]:
    scheduler = build_scheduler(tmp / name, gpu_blocks=4096, cpu_bytes=8192 * CHUNK_BYTES,
                                max_num_seqs=running + 16, max_num_batched_tokens=8192,
                                **SCHEDULER_OPTIONS)
    rec = None
    if instrumented:
        rec = Recorder(engine="vllm", model="bench", **RECORDER_OPTIONS)
        instrument_scheduler(scheduler, rec, steps=steps)
    driver = EngineDriver(scheduler, transfer_delay=2, keep_history=False)
    return Workload(driver, running), rec


def step_overhead(running: int, rounds: int, steps: int, warmup: int, cpu: bool = True,
                  blocks: int = 3, fourth: str = "untimed") -> dict[str, Any]:
    """Interleaved rounds over ``blocks`` fresh sets of the four schedulers, each set
    built in another order (where an object lands in memory moves its step time by up to
    ~1.5%, which a single build would count as kvobs's, or hide). The fourth is kvobs
    as :data:`FOURTH` names it (default: without step timing)."""
    order = ["plain", "kvobs", "control", fourth]
    times: dict[str, list[float]] = {name: [] for name in order}
    per_block: list[float] = []
    for block in range(blocks):
        built = order[block % len(order):] + order[:block % len(order)]
        with tempfile.TemporaryDirectory() as tmp:
            workloads: dict[str, Workload] = {}
            for name in built:
                with FOURTH_CONTEXT.get(name, contextlib.nullcontext)():
                    workloads[name], recorder = build(Path(tmp), name, running,
                                                      instrumented=name not in ("plain",
                                                                                "control"),
                                                      steps=name != "untimed")
                if name == "kvobs":
                    rec = recorder
            for name in built:
                workloads[name].steps(warmup)
            mine: dict[str, list[float]] = {name: [] for name in order}
            gc.disable()
            try:
                for round_no in range(rounds // blocks):
                    shift = round_no % len(built)
                    for name in built[shift:] + built[:shift]:
                        mine[name].append(workloads[name].steps(steps, cpu))
            finally:
                gc.enable()
            per_block.append(statistics.median(
                (k - p) / steps * 1e6 for k, p in zip(mine["kvobs"], mine["plain"], strict=True)))
            for name in order:
                times[name] += mine[name]
            running_now = len(workloads["kvobs"].driver.scheduler.running)
            snap = rec.snapshot()
    ratios = [k / p for k, p in zip(times["kvobs"], times["plain"], strict=True)]
    noise = [c / p for c, p in zip(times["control"], times["plain"], strict=True)]

    def added_us(name: str) -> float:  # median over rounds of the paired difference
        return round(statistics.median(
            (t - p) / steps * 1e6 for t, p in zip(times[name], times["plain"], strict=True)), 1)

    return {
        "clock": "thread CPU time" if cpu else "wall time",
        "running_requests": running_now,
        "step_us_plain": round(statistics.median(times["plain"]) / steps * 1e6, 1),
        "step_us_kvobs": round(statistics.median(times["kvobs"]) / steps * 1e6, 1),
        "ratio_median": round(statistics.median(ratios), 4),
        "ratio_total": round(sum(times["kvobs"]) / sum(times["plain"]), 4),
        "ratio_best": round(min(times["kvobs"]) / min(times["plain"]), 4),
        "control_ratio_median": round(statistics.median(noise), 4),
        "control_ratio_total": round(sum(times["control"]) / sum(times["plain"]), 4),
        "added_us_per_step": added_us("kvobs"),
        "fourth": fourth,
        "added_us_per_step_fourth": added_us(fourth),
        "control_added_us_per_step": added_us("control"),
        "gpu_to_host_chunks": snap.link("gpu", "host").blocks,
        "lookups": snap.lookups.lookups,
        "reuse_profile_references": snap.reuse.references if snap.reuse is not None else 0,
        "prefill_cost_source": rec.prefill_cost.source,
        "prefill_steps_timed": rec.prefill_cost._prefill_steps,
        "errors": dict(snap.errors),
        "added_us_per_block": [round(b, 1) for b in per_block],
    }


@contextlib.contextmanager
def _readers_replaced(replace: Callable[[str, Any], Any]) -> Iterator[None]:
    """While it lasts, every adapter hook table the scheduler is instrumented from (the
    pool's counting-only ``get_new_blocks`` included) holds ``replace(name, reader)`` in
    place of each before / after reader (``name``: ``"<module>.<method> before"``)."""
    from kvobs.adapters.vllm import block_pool, connector, lookups, offloading
    from kvobs.adapters.vllm import steps as step_timing

    def replaced(module: Any, hook: Any) -> Any:
        short = module.__name__.rsplit(".", 1)[-1]
        return dataclasses.replace(
            hook, before=hook.before and replace(f"{short}.{hook.method} before", hook.before),
            after=hook.after and replace(f"{short}.{hook.method} after", hook.after))

    tables = [(module, "SPEC") for module in (block_pool, connector, lookups, offloading,
                                              step_timing)] + [(block_pool, "COUNT_ONLY")]
    saved = [getattr(module, name) for module, name in tables]
    try:
        for (module, name), table in zip(tables, saved, strict=True):
            setattr(module, name, replaced(module, table) if name != "SPEC" else
                    dataclasses.replace(table, hooks=tuple(replaced(module, hook)
                                                           for hook in table.hooks)))
        yield
    finally:
        for (module, name), table in zip(tables, saved, strict=True):
            setattr(module, name, table)


def reader_costs(running: int, steps: int, warmup: int) -> list[tuple[str, float, float]]:
    """``(reader, calls per step, us per call)`` of every adapter reader, timed in place."""
    spent: dict[str, list[int]] = {}
    clock = time.perf_counter_ns

    def shim(name: str, reader: Any) -> Any:
        tally = spent.setdefault(name, [0, 0])

        def timed(*args: Any, **kwargs: Any) -> Any:
            started = clock()
            try:
                return reader(*args, **kwargs)
            finally:
                tally[0] += clock() - started
                tally[1] += 1

        return timed

    empty = shim("(empty)", lambda: None)
    with _readers_replaced(shim), tempfile.TemporaryDirectory() as tmp:
        workload, _ = build(Path(tmp), "kvobs", running, instrumented=True)
        workload.steps(warmup)
        for tally in spent.values():
            tally[:] = [0, 0]
        gc.disable()
        try:
            workload.steps(steps)
            for _ in range(steps * 10):
                empty()
        finally:
            gc.enable()
    empty_ns, empty_calls = spent.pop("(empty)")
    own = empty_ns / empty_calls
    return sorted(((name, calls / steps, (ns / calls - own) / 1e3)
                   for name, (ns, calls) in spent.items() if calls),
                  key=lambda row: -row[1] * row[2])


#: Where the scheduler keeps each object the adapters wrap (found by identity).
_PATHS = ("", "kv_cache_manager", "kv_cache_manager.block_pool", "connector.connector_scheduler",
          "connector.connector_scheduler.manager")


def _resolve(root: Any, path: str) -> Any:
    for name in filter(None, path.split(".")):
        root = getattr(root, name)
    return root


def _nothing(name: str, reader: Any) -> Callable[..., None]:
    """A no-op in place of ``reader`` (:func:`_readers_replaced`): the floor of wrapping,
    with the wrappers, ``when`` gates and ``count=`` hooks left as they are."""
    def nothing(*args: Any, **kwargs: Any) -> None:
        return None

    return nothing


#: What ``--methods`` sets beside plain and kvobs: the wrappers with no-op readers (their
#: floor).
VERSUS = {"hooks": lambda: _readers_replaced(_nothing)}
#: The step A/B's fourth scheduler (``--fourth``), as its line names it.
FOURTH = {"untimed": "without step timing", "bare": "its wrappers alone (no reader)",
          "no-profile": "without the reuse profile"}
#: How each fourth scheduler is built, where not as kvobs is.
FOURTH_CONTEXT: dict[str, Callable[[], Any]] = {
    "bare": lambda: _readers_replaced(lambda name, reader: None),
    "no-profile": lambda: _recorder_options(profile_reuse=False)}


@contextlib.contextmanager
def _recorder_options(**options: Any) -> Iterator[None]:
    """While it lasts, instrumented schedulers' recorders take ``options`` too."""
    saved = dict(RECORDER_OPTIONS)
    RECORDER_OPTIONS.update(options)
    try:
        yield
    finally:
        RECORDER_OPTIONS.clear()
        RECORDER_OPTIONS.update(saved)
#: Each ``--versus``'s column head and what its scheduler is.
THIRD = {"hooks": ("hooks", "kvobs with no-op readers")}


def method_costs(running: int, rounds: int, steps: int, warmup: int,
                 versus: str = "hooks") -> list[tuple[str, float, float, float, float]]:
    """Per wrapped engine method, in place: ``(method, calls per step, plain us/call, kvobs
    us/call, versus us/call)``, from three schedulers driven alike in interleaved
    rounds: not instrumented, instrumented, and instrumented with every reader a no-op
    (what the wrappers alone cost). Each method's time is exclusive of the wrapped
    methods it calls, so the rows add up. The scheduler's own ``schedule`` /
    ``update_from_output`` (step timing's hooks, which hold the whole step) are left out:
    ``--readers`` times their readers. The three are built once, in one order (where a
    scheduler lands in memory moves its time by up to ~1.5%)."""
    names = ("plain", "kvobs", "hooks")
    with tempfile.TemporaryDirectory() as tmp:
        workloads: dict[str, Workload] = {}
        for name in names:
            if name == "hooks":
                with VERSUS[versus]():
                    workloads[name], _ = build(Path(tmp), name, running, instrumented=True)
            else:
                workloads[name], _ = build(Path(tmp), name, running,
                                           instrumented=name == "kvobs")
        reference = workloads["kvobs"].driver.scheduler
        marker = _hooks.MARKER
        wrapped = sorted({(path, method) for path in _PATHS
                          for method in getattr(_resolve(reference, path), marker).wrapped_methods
                          if path or method not in ("schedule", "update_from_output")})
        clock = time.perf_counter_ns
        spent: dict[tuple[str, str, str], list[int]] = {}
        shims: dict[tuple[str, str, str], Any] = {}
        for name in names:
            stack = [0]  # time spent in wrapped methods called from the current one

            def shim(fn: Any, tally: list[int], stack: list[int] = stack) -> Any:
                def timed(*args: Any, **kwargs: Any) -> Any:
                    stack.append(0)
                    started = clock()
                    try:
                        return fn(*args, **kwargs)
                    finally:
                        elapsed = clock() - started
                        tally[0] += elapsed - stack.pop()
                        tally[1] += 1
                        stack[-1] += elapsed

                return timed

            scheduler = workloads[name].driver.scheduler
            for path, method in wrapped:
                target = _resolve(scheduler, path)
                tally = spent.setdefault((name, path, method), [0, 0])
                shims[(name, path, method)] = shim(getattr(target, method), tally)
                setattr(target, method, shims[(name, path, method)])
        for name in names:
            workloads[name].steps(warmup)
        for tally in spent.values():
            tally[:] = [0, 0]
        gc.disable()
        try:
            for round_no in range(rounds):
                shift = round_no % len(names)
                for name in names[shift:] + names[:shift]:
                    workloads[name].steps(steps)
        finally:
            gc.enable()
        for (name, path, method), timed in shims.items():
            # a rewrap (a hook table's hook installed again after the shims) would replace a
            # shim and, in the no-op scheduler, install real readers
            if getattr(_resolve(workloads[name].driver.scheduler, path), method) is not timed:
                raise RuntimeError(f"{name}: {path}.{method} was rewrapped during the run; "
                                   "its times would be wrong")
    for path, method in wrapped:
        counts = {name: spent[(name, path, method)][1] for name in names}
        if len(set(counts.values())) > 1:  # the same workload makes the same calls
            raise RuntimeError(f"{path}.{method} was called unequally: {counts}")
    total_steps = rounds * steps
    rows: list[tuple[str, float, float, float, float]] = []
    for path, method in wrapped:
        plain, kvobs, third = (ns / calls / 1e3 if calls else 0.0
                               for ns, calls in (spent[(name, path, method)] for name in names))
        per_step = spent[("kvobs", path, method)][1] / total_steps
        owner = path.rsplit(".", 1)[-1] or "scheduler"
        rows.append((f"{owner}.{method}", per_step, plain, kvobs, third))
    return sorted(rows, key=lambda row: -row[1] * (row[3] - row[2]))


def bytecode_counts(running: int, steps: int, warmup: int) -> list[tuple[str, float, float]]:
    """``(function, calls per step, bytecodes per step)`` of every kvobs Python function
    (wrappers and readers) an instrumented scheduler runs: counted with an opcode
    tracer, so the same workload gives the same figures on any machine, however loaded.
    What kvobs's Python does per step, not what it costs: C calls count as the one
    bytecode that makes them, and the tracer's own time is nowhere."""
    package = str(Path(inspect.getfile(Recorder)).parent)  # the kvobs package
    ops: dict[Any, int] = {}
    calls: dict[Any, int] = {}

    def opcodes(frame: Any, event: str, arg: Any) -> Any:
        if event == "opcode":
            ops[frame.f_code] = ops.get(frame.f_code, 0) + 1
        return opcodes

    def entered(frame: Any, event: str, arg: Any) -> Any:
        code = frame.f_code
        if not code.co_filename.startswith(package):
            return None
        calls[code] = calls.get(code, 0) + 1
        frame.f_trace_lines = False
        frame.f_trace_opcodes = True
        return opcodes

    with tempfile.TemporaryDirectory() as tmp:
        workload, _ = build(Path(tmp), "kvobs", running, instrumented=True)
        workload.steps(warmup)
        gc.collect()
        gc.disable()
        sys.settrace(entered)
        try:
            workload.steps(steps)
        finally:
            sys.settrace(None)
            gc.enable()

    def where(code: Any) -> str:
        name = f"{Path(code.co_filename).relative_to(package).with_suffix('')}"
        return f"{name.replace('/', '.')}.{code.co_name}"

    return sorted(((where(code), calls[code] / steps, ops.get(code, 0) / steps)
                   for code in calls), key=lambda row: -row[2])


def scrape_cost(blocks: int, repeats: int) -> dict[str, Any]:
    """Milliseconds per ``rec.snapshot()`` of an instrumented pool of ``blocks`` blocks,
    and per full HTTP scrape of its ``/metrics`` (snapshot, render, transfer)."""
    import urllib.request

    from vllm.v1.core.block_pool import BlockPool
    from vllm.v1.core.kv_cache_utils import make_block_hash_with_group_id

    from kvobs.telemetry.prometheus import start_metrics_server

    pool = BlockPool(blocks + 1, enable_caching=True, hash_block_size=16)
    rec = Recorder(engine="vllm", model="bench")
    instrument_block_pool(pool, rec)
    held = pool.get_new_blocks(blocks)
    rnd = random.Random(0)
    for block in rnd.sample(held, blocks // 2):  # half the blocks hold a prefix hash
        block.set_block_hash(make_block_hash_with_group_id(rnd.randbytes(32), 0), 16)
    rnd.shuffle(held)
    pool.free_blocks(held[: blocks // 2])  # half in use, the freed hashed ones cached
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        snap = rec.snapshot()
        times.append(time.perf_counter() - started)
    server = start_metrics_server("127.0.0.1:0")
    server.attach(rec)
    http = []
    try:
        for _ in range(repeats):
            started = time.perf_counter()
            with urllib.request.urlopen(server.url, timeout=10) as response:
                response.read()
            http.append(time.perf_counter() - started)
    finally:
        server.close()
    gpu = snap.tier("gpu")
    return {"gpu_blocks": blocks, "scrape_ms_median": round(statistics.median(times) * 1e3, 2),
            "scrape_ms_best": round(min(times) * 1e3, 2),
            "http_scrape_ms_median": round(statistics.median(http) * 1e3, 2),
            "http_scrape_ms_best": round(min(http) * 1e3, 2), "in_use": gpu.in_use_blocks,
            "cached": gpu.cached_blocks}


def _print_rows(rows: list[tuple[str, float, float]], as_json: bool, keys: tuple[str, ...],
                line: Callable[[str, float, float], str], total: str) -> None:
    """``(name, per step, value)`` rows as one JSON list (figures to 3 decimals), or a
    line each and the total."""
    if as_json:
        print(json.dumps([{key: round(v, 3) if isinstance(v, float) else v
                           for key, v in zip(keys, row, strict=True)} for row in rows]))
        return
    for row in rows:
        print(line(*row))
    print(total)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--running", type=int, default=72, help="requests kept in the engine")
    parser.add_argument("--rounds", type=int, default=40, help="alternating rounds")
    parser.add_argument("--steps", type=int, default=10, help="steps per scheduler per round")
    parser.add_argument("--warmup", type=int, default=MAX_WARM * EVERY + 100,
                        help="steps before timing (default: past step timing's longest "
                             "warm-up, 1,024 timed steps at 1 in 4 where no cost gets "
                             "measured, as here, into its steady 1 in 32)")
    parser.add_argument("--blocks", type=int, default=3,
                        help="fresh sets of schedulers, each built in another order")
    parser.add_argument("--scrape-blocks", type=int, default=100_000)
    parser.add_argument("--scrape-repeats", type=int, default=30)
    parser.add_argument("--wall", action="store_true", help="time steps by wall clock")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--readers", action="store_true",
                        help="time each adapter reader in place instead (us per call and step)")
    parser.add_argument("--methods", action="store_true",
                        help="time each wrapped engine method in place instead: plain, "
                             "instrumented, and with no-op readers (the wrappers' floor)")
    parser.add_argument("--versus", choices=sorted(VERSUS), default="hooks",
                        help="--methods' third scheduler: no-op readers (hooks)")
    parser.add_argument("--fourth", choices=sorted(FOURTH), default="untimed",
                        help="the step A/B's fourth scheduler: kvobs without step timing "
                             "(untimed), its wrappers alone (bare), or without the reuse "
                             "profile (no-profile)")
    parser.add_argument("--no-profile", action="store_true",
                        help="instrument without the reuse profile (Recorder(profile_reuse="
                             "False)): what the what-if's profile costs")
    parser.add_argument("--async-scheduling", action="store_true",
                        help="vLLM's async scheduling (a GPU engine's default): the "
                             "AsyncScheduler, two batches in flight")
    parser.add_argument("--bytecodes", action="store_true",
                        help="count kvobs's Python bytecodes and calls per step instead, "
                             "per function (deterministic; --rounds x --steps steps)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.no_profile:
        RECORDER_OPTIONS["profile_reuse"] = False
    if args.async_scheduling:
        SCHEDULER_OPTIONS["async_scheduling"] = True
    if args.bytecodes:
        counted = bytecode_counts(args.running, args.rounds * args.steps, args.warmup)
        _print_rows(counted, args.json, ("function", "calls_per_step", "bytecodes_per_step"),
                    lambda n, c, b: f"{n:60s} {c:6.2f} calls/step {b:8.1f} bytecodes/step",
                    f"kvobs's Python, {args.running} running requests: "
                    f"{sum(b for _, _, b in counted):.0f} bytecodes in "
                    f"{sum(c for _, c, _ in counted):.1f} calls per step")
        return 0
    if args.methods:
        method_rows = method_costs(args.running, args.rounds, args.steps, args.warmup,
                                   args.versus)
        third, meaning = THIRD[args.versus]
        if args.json:
            print(json.dumps([{"method": n, "calls_per_step": round(c, 3), "plain_us": round(p, 2),
                               "kvobs_us": round(k, 2), f"{args.versus}_us": round(h, 2)}
                              for n, c, p, k, h in method_rows]))
            return 0
        print(f"us per call in place (plain, kvobs, {meaning}), then us added per step")
        print(f"{'wrapped method':44s} {'calls/step':>10s} {'plain':>7s} {'kvobs':>7s} "
              f"{third:>7s} {'kvobs':>8s} {third:>8s}")
        for name, calls, plain, kvobs, hooks in method_rows:
            if calls:
                print(f"{name:44s} {calls:10.2f} {plain:7.2f} {kvobs:7.2f} {hooks:7.2f} "
                      f"{calls * (kvobs - plain):+8.2f} {calls * (hooks - plain):+8.2f}")
        added = sum(c * (k - p) for _, c, p, k, _ in method_rows)
        floor = sum(c * (h - p) for _, c, p, _, h in method_rows)
        print(f"added inside wrapped methods, in place, {args.running} running requests: "
              f"{added:.1f} us per step; " + (
                  f"of which the wrappers with no-op readers (their floor) {floor:.1f} us"
                  if third == "hooks" else f"{meaning} {floor:.1f} us"))
        return 0
    if args.readers:
        rows = reader_costs(args.running, args.rounds * args.steps, args.warmup)
        _print_rows(rows, args.json, ("reader", "calls_per_step", "us_per_call"),
                    lambda n, c, u: f"{n:44s} {c:6.2f} calls/step {u:7.2f} us/call "
                                    f"{c * u:7.2f} us/step",
                    f"all readers, in place: {sum(c * u for _, c, u in rows):.1f} us per "
                    f"step ({args.running} running requests)")
        return 0
    result = {"step": step_overhead(args.running, args.rounds, args.steps, args.warmup,
                                    cpu=not args.wall, blocks=args.blocks,
                                    fourth=args.fourth),
              "scrape": scrape_cost(args.scrape_blocks, args.scrape_repeats)}
    if args.json:
        print(json.dumps(result))
        return 0
    step, scrape = result["step"], result["scrape"]
    print(f"scheduler step ({step['clock']}), {step['running_requests']} running requests: plain "
          f"{step['step_us_plain']:.0f} us, kvobs {step['step_us_kvobs']:.0f} us -> "
          f"{step['ratio_median']:.3f}x median of rounds ({step['ratio_total']:.3f}x totals, "
          f"{step['ratio_best']:.3f}x best rounds)")
    fourth = FOURTH[step["fourth"]]
    print(f"added per step: {step['added_us_per_step']:.1f} us ({fourth} "
          f"{step['added_us_per_step_fourth']:.1f} us; goal <= 10 us at 8 "
          f"running requests, <= 1.01x at 72)")
    print("added per step in each set of schedulers: "
          + ", ".join(f"{b:+.1f} us" for b in step["added_us_per_block"]))
    print(f"noise gauge, plain vs plain: {step['control_ratio_median']:.3f}x median, "
          f"{step['control_ratio_total']:.3f}x totals, "
          f"{step['control_added_us_per_step']:+.1f} us per step")
    print(f"one scrape at {scrape['gpu_blocks']} GPU blocks: {scrape['scrape_ms_median']:.2f} ms "
          f"median, {scrape['scrape_ms_best']:.2f} ms best (goal <= 5 ms); the whole HTTP "
          f"scrape {scrape['http_scrape_ms_median']:.2f} ms median, "
          f"{scrape['http_scrape_ms_best']:.2f} ms best")
    return 0


if __name__ == "__main__":
    sys.exit(main())
