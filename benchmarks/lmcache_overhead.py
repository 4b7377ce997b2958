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
LMCache's ``use_layerwise`` (kvobs's layer-copy and ``store_layer`` proxies on every
layer step).

Run from the repository root with the LMCache venv (``bash scripts/deps/engines.sh
lmcache``), as a module (it drives the LMCache test bed)::

    .venv-lmcache/bin/python -m benchmarks.lmcache_overhead
    .venv-lmcache/bin/python -m benchmarks.lmcache_overhead --layerwise --rounds 200
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import logging
import random
import statistics
import time
from collections.abc import Iterator
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


def overhead(rounds: int, requests: int, host_chunks: int, layerwise: bool,
             warmup: int) -> dict[str, Any]:
    drivers: dict[str, TimedDriver] = {}
    workloads: dict[str, Iterator[tuple[list[int], list[int]]]] = {}
    rec = Recorder(engine="lmcache", model="bench")
    for arm in ARMS:
        engine = build_engine(host_chunks=host_chunks, instance=f"bench-{arm}",
                              layerwise=layerwise)
        engine.stats_monitor = LMCStatsMonitor()     # not the process-wide one
        if arm == "kvobs":
            instrument_lmcache_engine(engine, rec)
        engine.post_init()
        drivers[arm] = TimedDriver(engine, save_decode=True)
        workloads[arm] = chat(seed=1)
    for arm in ARMS:                                 # fill the caches: they evict from here
        for _ in range(warmup):
            drivers[arm].serve(*next(workloads[arm]))
    spent: dict[str, list[float]] = {arm: [] for arm in ARMS}
    gc.collect()
    gc.disable()
    try:
        for n in range(rounds):
            for arm in ARMS[n % 3:] + ARMS[:n % 3]:  # rotate which arm goes first
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
    return {
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=120)
    parser.add_argument("--requests", type=int, default=8, help="requests per round and arm")
    parser.add_argument("--host-chunks", type=int, default=48,
                        help="slots of each engine's CPU backend (it evicts)")
    parser.add_argument("--warmup", type=int, default=60, help="requests before timing")
    parser.add_argument("--layerwise", action="store_true", help="LMCache's use_layerwise")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    logging.getLogger("lmcache").setLevel(logging.ERROR)
    try:
        result = overhead(args.rounds, args.requests, args.host_chunks, args.layerwise,
                          args.warmup)
    finally:
        destroy_all()
    if args.json:
        print(json.dumps(result))
        return 0
    mode = "layerwise" if args.layerwise else "one object a chunk"
    print(f"LMCache engine calls per request ({mode}, thread CPU time, {args.rounds} rounds "
          f"of {args.requests}): plain {result['plain_us_per_request']:.0f} us, kvobs "
          f"{result['kvobs_us_per_request']:.0f} us -> {result['ratio_median']:.3f}x "
          f"median of rounds")
    print(f"added per request: {result['added_us_per_request']:.1f} us; noise gauge, plain "
          f"vs plain: {result['control_ratio_median']:.3f}x, "
          f"{result['control_added_us']:+.1f} us")
    print(f"kvobs counted: {result['kvobs_saw']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
