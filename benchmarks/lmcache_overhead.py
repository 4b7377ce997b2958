"""Cost of kvobs in a real LMCache 0.5.6 engine's calls, instrumented against plain, side by side.

Three real ``LMCacheEngine`` s (a CPU backend of ``--host-chunks`` slots that evicts, the
test bed's stand-in for the GPU connector's byte copy) serve the same multi-turn chat
workload (Zipf-popular conversations that return with their whole history; answers
stored during decode, as ``save_decode_cache`` does) as LMCache's vLLM connector serves
it (:class:`tests.engines.lmcache056.lmcache_objects.ConnectorDriver`): one instrumented
as a server instruments it (``instrument_lmcache_engine``, the reuse profile on), one
plain, and a second plain one as the noise gauge (plain vs plain). Each engine gets a
stats monitor of its own: LMCache's is a process-wide singleton, whose hooks would
otherwise run for the plain engines too. Rounds of ``--requests`` requests rotate the
order of the three; only the engine's own calls are timed (the lookup through LMCache's
lookup client, ``retrieve`` / ``retrieve_layer``, ``store`` / ``store_layer``), as this
thread's CPU time, not the driver's stand-in model work. Prints the added microseconds
per request (the median over rounds of the paired difference) and the ratio (median over
rounds of instrumented / plain), with plain vs plain beside them. ``--layerwise``:
LMCache's ``use_layerwise`` (kvobs's layer-copy proxies on every layer step).

Where the added time goes:

* ``--fourth bare`` runs a fourth engine in the same rounds, instrumented with every
  hook's wrapper but no reader (the wrappers' floor; the layerwise copy proxies and
  ``post_init``'s attach stay as they are); ``--fourth no-profile`` one instrumented
  without the reuse profile;
* ``--readers`` instead times each hook's readers in place, in one instrumented engine
  (a ``perf_counter_ns`` shim around each, its own cost taken off): calls per request
  and microseconds per call, the median call (a shim's wall-clock time takes in what
  the machine does meanwhile; the median leaves that out).

Run from the repository root with the LMCache venv (``bash scripts/deps/engines.sh
lmcache``), as a module (it drives the LMCache test bed)::

    .venv-lmcache/bin/python -m benchmarks.lmcache_overhead
    .venv-lmcache/bin/python -m benchmarks.lmcache_overhead --layerwise --rounds 200
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import json
import logging
import random
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

from lmcache.observability import LMCStatsMonitor

from kvobs.adapters.lmcache import instrument_lmcache_engine
from kvobs.recorder import Recorder
from tests.engines.lmcache056.lmcache_objects import (
    ConnectorDriver,
    build_engine,
    destroy_all,
)

ARMS = ("plain", "kvobs", "control")
#: What ``--fourth`` adds to the rounds, as its line names it.
FOURTH = {"bare": "its wrappers alone (no reader)", "no-profile": "without the reuse profile"}


@contextlib.contextmanager
def readers_replaced(replace: Callable[[str, Any], Any]) -> Iterator[None]:
    """While it lasts, the LMCache adapter's hook tables hold ``replace(name, reader)`` in
    place of each before / after reader (``name``: ``"<method> before"``); ``post_init``'s
    reader, which attaches the CPU backend, stays."""
    from kvobs.adapters.lmcache import backend, engine

    def replaced(hook: Any) -> Any:
        if hook.method == "post_init":
            return hook
        return dataclasses.replace(
            hook, before=hook.before and replace(f"{hook.method} before", hook.before),
            after=hook.after and replace(f"{hook.method} after", hook.after))

    tables = [(backend, "SPEC"), (backend, "ALLOCATOR_SPEC"), (engine, "SPEC"),
              (engine, "CONNECTOR_SPEC"), (engine, "MONITOR_SPEC")]
    saved = [getattr(module, name) for module, name in tables]
    try:
        for (module, name), table in zip(tables, saved, strict=True):
            setattr(module, name, dataclasses.replace(
                table, hooks=tuple(replaced(hook) for hook in table.hooks)))
        yield
    finally:
        for (module, name), table in zip(tables, saved, strict=True):
            setattr(module, name, table)


class TimedDriver(ConnectorDriver):
    """The connector's calls, each engine call timed (this thread's CPU time)."""

    engine_seconds = 0.0

    @contextlib.contextmanager
    def _timed(self) -> Iterator[None]:
        started = time.thread_time()
        try:
            yield
        finally:
            self.engine_seconds += time.thread_time() - started

    def __post_init__(self) -> None:
        super().__post_init__()
        client, driver = self.lookup_client, self

        class TimedLookups:
            def lookup(self, *args: Any, **kwargs: Any) -> Any:
                with driver._timed():
                    return client.lookup(*args, **kwargs)

        self.lookup_client = TimedLookups()  # type: ignore[assignment]

    def _retrieve(self, *args: Any, **kwargs: Any) -> Any:
        with self._timed():
            return super()._retrieve(*args, **kwargs)

    def _store(self, *args: Any, **kwargs: Any) -> None:
        with self._timed():
            super()._store(*args, **kwargs)


def chat(seed: int) -> Iterator[tuple[list[int], list[int]]]:
    """``(prompt, answer)`` pairs: 12 conversations, Zipf-popular, each turn its history
    (a 40-token system prompt, every turn and answer so far) plus a new user turn; a
    conversation past 330 tokens starts again."""
    rnd = random.Random(seed)
    system = [rnd.randrange(1, 500) for _ in range(40)]
    histories = {c: list(system) for c in range(12)}
    weights = [1 / (c + 1) for c in range(12)]
    while True:
        c = rnd.choices(range(12), weights)[0]
        if len(histories[c]) > 330:
            histories[c] = list(system)
        histories[c] += [rnd.randrange(1, 500) for _ in range(rnd.randrange(5, 30))]
        answer = [rnd.randrange(1, 500) for _ in range(rnd.randrange(24, 64))]
        yield list(histories[c]), answer
        histories[c] += answer


def build(arm: str, host_chunks: int, layerwise: bool, rec: Recorder) -> TimedDriver:
    """One engine of the rounds, instrumented as ``arm`` says, with its connector driver."""
    engine = build_engine(host_chunks=host_chunks, instance=f"bench-{arm}",
                          layerwise=layerwise)
    engine.stats_monitor = LMCStatsMonitor()         # not the process-wide one
    bare = readers_replaced(lambda name, reader: None) if arm == "bare" else \
        contextlib.nullcontext()
    with bare:                                       # post_init attaches the backend's hooks
        if arm not in ("plain", "control"):
            instrument_lmcache_engine(engine, rec)
        engine.post_init()
    return TimedDriver(engine, save_decode=True)


def overhead(rounds: int, requests: int, host_chunks: int, layerwise: bool,
             warmup: int, fourth: str | None = None) -> dict[str, Any]:
    arms = (*ARMS, fourth) if fourth else ARMS
    drivers: dict[str, TimedDriver] = {}
    workloads: dict[str, Iterator[tuple[list[int], list[int]]]] = {}
    rec = Recorder(engine="lmcache", model="bench")
    for arm in arms:
        arm_rec = Recorder(engine="lmcache", model="bench", profile_reuse=arm != "no-profile") \
            if arm in FOURTH else rec
        drivers[arm] = build(arm, host_chunks, layerwise, arm_rec)
        workloads[arm] = chat(seed=1)
    for arm in arms:                                 # fill the caches: they evict from here
        for _ in range(warmup):
            drivers[arm].serve(*next(workloads[arm]))
    spent: dict[str, list[float]] = {arm: [] for arm in arms}
    gc.collect()
    gc.disable()
    try:
        for n in range(rounds):
            k = n % len(arms)
            for arm in arms[k:] + arms[:k]:          # rotate which arm goes first
                driver = drivers[arm]
                before = driver.engine_seconds
                for _ in range(requests):
                    driver.serve(*next(workloads[arm]))
                spent[arm].append((driver.engine_seconds - before) / requests)
            if n % 10 == 9:
                gc.collect()
    finally:
        gc.enable()
    plain, kvobs, control = (spent[arm] for arm in ARMS)
    snap = rec.snapshot()
    host = snap.tier("host")
    extra = {} if not fourth else {
        "fourth": fourth,
        "fourth_added_us": statistics.median(f - p for f, p in zip(spent[fourth], plain,
                                                                    strict=True)) * 1e6,
        "fourth_ratio_median": statistics.median(f / p for f, p in zip(spent[fourth], plain,
                                                                        strict=True))}
    return {**extra,
        "layerwise": layerwise,
        "requests_per_round": requests,
        "rounds": rounds,
        "plain_us_per_request": statistics.median(plain) * 1e6,
        "kvobs_us_per_request": statistics.median(kvobs) * 1e6,
        "added_us_per_request": statistics.median(k - p for k, p in zip(kvobs, plain,
                                                                         strict=True)) * 1e6,
        "ratio_median": statistics.median(k / p for k, p in zip(kvobs, plain, strict=True)),
        "control_ratio_median": statistics.median(c / p for c, p in zip(control, plain,
                                                                         strict=True)),
        "control_added_us": statistics.median(c - p for c, p in zip(control, plain,
                                                                     strict=True)) * 1e6,
        "kvobs_saw": {"lookups": snap.lookups.lookups, "host_stores": host.stores,
                      "host_evictions": sum(host.evictions.values()),
                      "errors": dict(snap.errors)},
    }


def reader_costs(requests: int, host_chunks: int, layerwise: bool,
                 warmup: int) -> list[tuple[str, float, float]]:
    """``(reader, calls per request, us per call)`` of every hook's reader, timed in place
    in one instrumented engine (the median call, less the shim's own)."""
    spent: dict[str, list[int]] = {}
    clock = time.perf_counter_ns

    def shim(name: str, reader: Any) -> Any:
        calls = spent.setdefault(name, [])

        def timed(*args: Any, **kwargs: Any) -> Any:
            started = clock()
            try:
                return reader(*args, **kwargs)
            finally:
                calls.append(clock() - started)

        return timed

    empty = shim("(empty)", lambda: None)
    with readers_replaced(shim):
        driver = build("kvobs", host_chunks, layerwise, Recorder(engine="lmcache", model="bench"))
    workload = chat(seed=1)
    for _ in range(warmup):
        driver.serve(*next(workload))
    for calls in spent.values():
        calls.clear()
    gc.collect()
    gc.disable()
    try:
        for _ in range(requests):
            driver.serve(*next(workload))
        for _ in range(requests * 10):
            empty()
    finally:
        gc.enable()
    own = statistics.median(spent.pop("(empty)"))
    return sorted(((name, len(calls) / requests, (statistics.median(calls) - own) / 1e3)
                   for name, calls in spent.items() if calls),
                  key=lambda row: -row[1] * row[2])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=120)
    parser.add_argument("--requests", type=int, default=8, help="requests per round and arm")
    parser.add_argument("--host-chunks", type=int, default=48,
                        help="slots of each engine's CPU backend (it evicts)")
    parser.add_argument("--warmup", type=int, default=60, help="requests before timing")
    parser.add_argument("--layerwise", action="store_true", help="LMCache's use_layerwise")
    parser.add_argument("--fourth", choices=sorted(FOURTH),
                        help="a fourth engine in the rounds: " + "; ".join(
                            f"{k}: {v}" for k, v in FOURTH.items()))
    parser.add_argument("--readers", action="store_true",
                        help="time each hook's readers in place instead (--rounds x "
                             "--requests requests)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    logging.getLogger("lmcache").setLevel(logging.ERROR)
    mode = "layerwise" if args.layerwise else "one object a chunk"
    if args.readers:
        try:
            rows = reader_costs(args.rounds * args.requests, args.host_chunks, args.layerwise,
                                args.warmup)
        finally:
            destroy_all()
        for name, calls, us in rows:
            print(f"{name:32s} {calls:6.2f} calls a request  {us:6.2f} us a call  "
                  f"{calls * us:6.1f} us a request")
        print(f"all readers, in place ({mode}): {sum(c * u for _, c, u in rows):.1f} us per "
              "request")
        return 0
    try:
        result = overhead(args.rounds, args.requests, args.host_chunks, args.layerwise,
                          args.warmup, args.fourth)
    finally:
        destroy_all()
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"LMCache engine calls per request ({mode}, thread CPU time, {args.rounds} rounds "
          f"of {args.requests}): plain {result['plain_us_per_request']:.0f} us, kvobs "
          f"{result['kvobs_us_per_request']:.0f} us -> {result['ratio_median']:.3f}x "
          f"median of rounds")
    print(f"added per request: {result['added_us_per_request']:.1f} us; noise gauge, plain "
          f"vs plain: {result['control_ratio_median']:.3f}x, "
          f"{result['control_added_us']:+.1f} us")
    if args.fourth:
        print(f"{FOURTH[args.fourth]}: {result['fourth_added_us']:+.1f} us, "
              f"{result['fourth_ratio_median']:.3f}x")
    print(f"kvobs counted: {result['kvobs_saw']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
