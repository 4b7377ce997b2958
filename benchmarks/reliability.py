"""Reliability figures for the README: scrape load, many engines, sink faults, soak.

Every figure is measured side by side in one run (phases alternate, so both sides see
the same machine) and printed as a ratio next to its parts.

Subcommands:
    scrape-load   16 scrapers against an engine running flat out (the demo's pool,
                  unpaced, benchmarks/reliability_engine.py in its own process): scrape
                  errors, p50/p99, and the engine's ticks per second with scrapers on vs
                  off, alternating every --phase seconds.
    engines       8 engines x 3 tiers exported on one endpoint: scrape p50/p99 beside
                  kvobs's in-process render, prometheus_client's generate_latest and a
                  direct render of the same series.
    sink-faults   the engine's event rate while its OTLP collector is healthy, refusing,
                  answering 5xx, stalling and black-holing, phases interleaved.
    soak          1e7 block events over 1e6 distinct keys through a recorder (host tier:
                  thrash tracker and residency): RSS growth, untracked count.
    vllm-scrape   one vLLM engine with 100,000 GPU blocks: snapshot, render, HTTP scrape
                  (.venv-vllm/bin/python).
    drain         what one collection costs after the engine ran flat out for a while:
                  its buffered histogram samples are recorded into OpenTelemetry then.

Usage (from the checkout's root; sink-faults reuses tests.reliability's receiver):
    python benchmarks/reliability.py scrape-load --seconds 60
    python benchmarks/reliability.py engines
    python -m benchmarks.reliability sink-faults
    python benchmarks/reliability.py soak --events 10000000 --keys 1000000
    python benchmarks/reliability.py drain
    .venv-vllm/bin/python benchmarks/reliability.py vllm-scrape
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) by nearest rank; nan for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


# --- an engine process ---------------------------------------------------------------


class EngineProcess:
    """benchmarks/reliability_engine.py in a subprocess; windows of ticks read from it."""

    def __init__(self, duration_s: float, *extra: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, str(REPO / "benchmarks" / "reliability_engine.py"),
             "--duration", str(duration_s), "--window", "0.25", *extra],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        assert self.process.stdout is not None
        first = self.process.stdout.readline()
        if not first:
            raise RuntimeError("the engine process exited before serving /metrics")
        self.url: str = json.loads(first)["url"]
        self.windows: list[dict[str, Any]] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.windows.append(json.loads(line))

    def ticks_per_s(self, start: float, end: float) -> float:
        """Loop steps per second over the windows that ended within ``[start, end]``."""
        chosen = [w for w in self.windows if start < w["t"] <= end]
        seconds = sum(w["seconds"] for w in chosen)
        return sum(w["ticks"] for w in chosen) / seconds if seconds else float("nan")

    def close(self) -> None:
        if self.process.poll() is None:
            assert self.process.stdin is not None
            self.process.stdin.close()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)


# --- scrapers --------------------------------------------------------------------------


class Scrapers:
    """``n`` threads scraping ``url`` while ``active`` is set; latencies and errors kept."""

    def __init__(self, url: str, n: int, interval_s: float = 0.0,
                 check: Callable[[bytes], bool] | None = None, timeout_s: float = 10.0) -> None:
        self.url, self.interval_s, self.timeout_s = url, interval_s, timeout_s
        self.check = check or (lambda body: body.rstrip().endswith(b"# EOF") or b"kvobs_" in body)
        self.active = threading.Event()
        self.done = threading.Event()
        self.latencies: list[float] = []
        self.errors: list[str] = []
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(n)]
        for thread in self._threads:
            thread.start()

    def _run(self) -> None:
        while not self.done.is_set():
            if not self.active.wait(0.05):
                continue
            start = time.perf_counter()
            try:
                with urllib.request.urlopen(self.url, timeout=self.timeout_s) as response:
                    body = response.read()
                    ok = response.status == 200 and self.check(body)
            except (urllib.error.URLError, OSError) as exc:
                self.errors.append(repr(exc))
                continue
            elapsed = time.perf_counter() - start
            if ok:
                self.latencies.append(elapsed)
            else:
                self.errors.append("incomplete or unexpected body")
            if self.interval_s:
                time.sleep(max(0.0, self.interval_s - elapsed))

    def stop(self) -> None:
        self.done.set()
        for thread in self._threads:
            thread.join(timeout=self.timeout_s + 5)


def scrape_load(seconds: float, scrapers: int, phase_s: float, interval_s: float,
                server: str = "plain", nice: int = 0) -> dict[str, Any]:
    """``scrapers`` concurrent scrapers vs one, alternating, against an engine flat out.

    One scraper (every ``interval_s``, like a Prometheus) runs throughout: collection
    drains the engine's buffered histogram samples, a cost of being observed at all that
    the scrape count does not change, so it is in both phases. The other ``scrapers - 1``
    join in alternate phases; the loss is what they add. ``observed_cost`` is the first
    phase-pair's rate without any scraper against the single scraper, for reference.

    ``nice`` > 0 lowers the scrapers' priority (the engine keeps its own): on a machine
    this small they would otherwise take CPU from the engine that, in a cluster,
    Prometheus takes on another host. What is left is what serving costs the engine.
    """
    engine = EngineProcess(seconds + 20, "--server", server)
    if nice:
        os.setpriority(os.PRIO_PROCESS, 0, nice)  # this process only: the engine is started
    try:
        single = Scrapers(engine.url, 1, interval_s)
        crowd = Scrapers(engine.url, scrapers - 1, interval_s)
        time.sleep(1.0)  # the engine's first windows (post warm-up)
        idle_start = time.monotonic()
        time.sleep(phase_s)
        idle = (idle_start, time.monotonic())
        single.active.set()
        on: list[tuple[float, float]] = []
        off: list[tuple[float, float]] = []
        end = time.monotonic() + seconds
        loaded = True
        while time.monotonic() < end:
            loaded = not loaded
            (crowd.active.set if loaded else crowd.active.clear)()
            time.sleep(0.3)  # settle: requests of the previous phase finish
            start = time.monotonic()
            time.sleep(phase_s)
            (on if loaded else off).append((start, time.monotonic()))
        crowd.active.clear()
        single.active.clear()
        time.sleep(0.6)
        single.stop()
        crowd.stop()
    finally:
        engine.close()
        if nice:
            os.setpriority(os.PRIO_PROCESS, 0, 0)
    rate_on = statistics.fmean(engine.ticks_per_s(a, b) for a, b in on)
    rate_off = statistics.fmean(engine.ticks_per_s(a, b) for a, b in off)
    rate_idle = engine.ticks_per_s(*idle)
    latencies = single.latencies + crowd.latencies
    return {
        "server": server,
        "scrapers_nice": nice,
        "scrapers": scrapers,
        "interval_s": interval_s,
        "seconds_loaded": round(sum(b - a for a, b in on), 1),
        "scrapes": len(latencies),
        "errors": len(single.errors) + len(crowd.errors),
        "p50_ms": round(percentile(latencies, 0.5) * 1e3, 2),
        "p99_ms": round(percentile(latencies, 0.99) * 1e3, 2),
        "engine_ticks_per_s_no_scraper": round(rate_idle, 1),
        "engine_ticks_per_s_one_scraper": round(rate_off, 1),
        "engine_ticks_per_s_all_scrapers": round(rate_on, 1),
        "engine_loss": round(1 - rate_on / rate_off, 4),
        "observed_cost": round(1 - rate_off / rate_idle, 4),
    }


# --- many engines on one endpoint ------------------------------------------------------


@contextmanager
def engines_endpoint(engines: int = 8) -> Iterator[tuple[str, Any]]:
    """``engines`` recorders x 3 tiers, every series on one /metrics (see test_load.py);
    yields the URL and the server's registry."""
    from kvobs.recorder import Recorder
    from kvobs.telemetry.prometheus import start_metrics_server
    from kvobs.telemetry.series import snapshot_series

    recorders = [busy_recorder(Recorder, e) for e in range(engines)]

    def source(rec: Any) -> Callable[[], dict[str, Any]]:
        common = {"engine": rec.engine, "model": rec.model, **rec.labels}
        return lambda: {name: [({**common, **labels}, v) for labels, v in values]
                        for name, values in snapshot_series(rec.snapshot()).items()}

    server = start_metrics_server("127.0.0.1:0")  # min interval 0: every scrape collects
    server.attach(recorders[0], sources=[source(r) for r in recorders[1:]])
    try:
        yield server.url, server.registry
    finally:
        server.close()


def busy_recorder(recorder_cls: Any, index: int) -> Any:
    """A recorder with every kind of series a 3-tier engine exports, all non-zero."""
    rec = recorder_cls(engine=f"engine-{index}", model="llama-3-8b",
                       labels={"dp_rank": str(index)})
    for name, capacity in (("gpu", 4096), ("host", 16384), ("disk", 65536)):
        tier = rec.add_tier(name, capacity_blocks=capacity, block_tokens=16, block_bytes=2**21)
        tier.allocate(100)
        tier.free(50, cached=True)
        tier.store(20)
        tier.evict(3, reason="explicit")
    for src, dst in (("gpu", "host"), ("host", "gpu"), ("host", "disk"), ("disk", "host")):
        link = rec.link(src, dst)
        link.transfer(4, 4 * 2**21, 0.002)
        link.fail(1)
        link.drop(2)
    for i in range(200):
        rec.lookup(64, gpu_hit=16, host_hit=16, keys=[(index, i, j) for j in range(4)])
    return rec


def direct_render(recorders: list[Any]) -> bytes:
    """The counters and gauges of ``recorders`` as Prometheus text, straight from
    ``snapshot_series`` and the catalog: no OpenTelemetry SDK (histograms left out).

    Not what kvobs serves: an estimate of what a direct /metrics path would cost.
    """
    from kvobs.catalog import METRICS
    from kvobs.telemetry.series import snapshot_series

    per_engine = []
    for rec in recorders:
        common = {"engine": rec.engine, "model": rec.model, **rec.labels}
        per_engine.append((common, snapshot_series(rec.snapshot())))
    out = []
    for spec in METRICS:
        if spec.kind == "histogram":
            continue
        kind = "counter" if spec.kind == "counter" else "gauge"
        out.append(f"# HELP {spec.name} {spec.help}\n# TYPE {spec.name} {kind}\n")
        for common, series in per_engine:
            for labels, value in series.get(spec.name, ()):
                text = ",".join(f'{k}="{v}"' for k, v in {**common, **labels}.items())
                out.append(f"{spec.name}{{{text}}} {float(value)!r}\n")
    return "".join(out).encode()


def engines_scrape(engines: int, scrapes: int) -> dict[str, Any]:
    """Scrapes of the many-engine endpoint, side by side in one run (each round takes
    one of each, so all see the same machine): a full HTTP scrape, kvobs's collection
    and render in the process, prometheus_client's ``generate_latest`` of the same
    registry, and the direct render estimate. Latency quantiles and their ratios."""
    import structlog
    from prometheus_client import generate_latest

    from kvobs.recorder import Recorder
    from kvobs.telemetry.text import render

    with structlog.testing.capture_logs():  # busy_recorder counts an error on purpose
        recorders = [busy_recorder(Recorder, e) for e in range(engines)]
    times: dict[str, list[float]] = {"http": [], "render": [], "generate_latest": [],
                                     "direct": []}
    with structlog.testing.capture_logs(), engines_endpoint(engines) as (url, registry):
        steps: dict[str, Callable[[], Any]] = {
            "http": lambda: urllib.request.urlopen(url, timeout=10).read(),
            "render": lambda: render(registry.collect()),
            "generate_latest": lambda: generate_latest(registry),
            "direct": lambda: direct_render(recorders),
        }
        body = steps["http"]()
        for _ in range(scrapes):
            for name, step in steps.items():
                start = time.perf_counter()
                step()
                times[name].append(time.perf_counter() - start)
    lines = sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))
    p50 = {name: percentile(values, 0.5) * 1e3 for name, values in times.items()}
    return {"engines": engines, "tiers": 3, "samples": lines, "bytes": len(body),
            "p50_ms": round(p50["http"], 2),
            "p99_ms": round(percentile(times["http"], 0.99) * 1e3, 2),
            "render_p50_ms": round(p50["render"], 2),
            "generate_latest_p50_ms": round(p50["generate_latest"], 2),
            "direct_render_p50_ms": round(p50["direct"], 2),
            "http_over_direct": round(p50["http"] / p50["direct"], 2),
            "generate_latest_over_render": round(p50["generate_latest"] / p50["render"], 2),
            "goal": "p50 <= 5 ms and <= 5x the direct render"}


def vllm_scrape(blocks: int, scrapes: int) -> dict[str, Any]:
    """One vLLM 0.33 ``BlockPool`` of ``blocks`` GPU blocks (half in use, half cached with
    a prefix hash), instrumented: its snapshot, kvobs's render, prometheus_client's
    ``generate_latest`` of the same registry and a full HTTP scrape (every scrape
    collects), then scrapes against Telemetry's default server (at most four collections a
    second), side by side round by round. Runs in ``.venv-vllm``."""
    import random

    import structlog
    from prometheus_client import generate_latest
    from vllm.v1.core.block_pool import BlockPool
    from vllm.v1.core.kv_cache_utils import make_block_hash_with_group_id

    from kvobs.adapters.vllm import instrument_block_pool
    from kvobs.recorder import Recorder
    from kvobs.telemetry.coalesce import MIN_INTERVAL_S
    from kvobs.telemetry.prometheus import start_metrics_server
    from kvobs.telemetry.text import render

    pool = BlockPool(blocks + 1, enable_caching=True, hash_block_size=16)
    rec = Recorder(engine="vllm", model="bench")
    instrument_block_pool(pool, rec)
    held = pool.get_new_blocks(blocks)
    rnd = random.Random(1)
    for block in rnd.sample(held, blocks // 2):
        block.set_block_hash(make_block_hash_with_group_id(rnd.randbytes(32), 0), 16)
    rnd.shuffle(held)
    pool.free_blocks(held[: blocks // 2])
    fresh = start_metrics_server("127.0.0.1:0")
    default = start_metrics_server("127.0.0.1:0", min_interval_s=MIN_INTERVAL_S)
    for server in (fresh, default):
        server.attach(rec)
    times: dict[str, list[float]] = {k: [] for k in
                                     ("snapshot", "render", "generate_latest", "http",
                                      "http_default_server")}
    steps: dict[str, Callable[[], Any]] = {
        "snapshot": rec.snapshot,
        "render": lambda: render(fresh.registry.collect()),
        "generate_latest": lambda: generate_latest(fresh.registry),
        "http": lambda: urllib.request.urlopen(fresh.url, timeout=10).read(),
        "http_default_server": lambda: urllib.request.urlopen(default.url, timeout=10).read(),
    }
    try:
        with structlog.testing.capture_logs():
            for _ in range(scrapes):
                for name, step in steps.items():
                    start = time.perf_counter()
                    step()
                    times[name].append(time.perf_counter() - start)
    finally:
        fresh.close()
        default.close()
    gpu = rec.snapshot().tier("gpu")
    p50 = {name: round(percentile(values, 0.5) * 1e3, 3) for name, values in times.items()}
    return {"gpu_blocks": blocks, "in_use": gpu.in_use_blocks, "cached": gpu.cached_blocks,
            **{f"{name}_p50_ms": value for name, value in p50.items()},
            "http_best_ms": round(min(times["http"]) * 1e3, 3),
            "generate_latest_over_render": round(p50["generate_latest"] / p50["render"], 2),
            "goal": "a full HTTP scrape (every scrape collecting) <= 3 ms"}


# --- sink faults -----------------------------------------------------------------------


def sink_faults(phase_s: float, rounds: int) -> dict[str, Any]:
    """Engine ticks per second per receiver mode, modes interleaved round by round.

    One engine pushes OTLP every 0.2 s (timeout 0.5 s) while the receiver cycles through
    its modes; each figure is the median over rounds of one phase's rate, so a burst of
    other work on the machine moves one phase, not the result.
    """
    from tests.reliability.faulty_receiver import FaultyReceiver

    modes = ("ok", "refuse", "5xx", "stall", "blackhole")
    rates: dict[str, list[float]] = {m: [] for m in modes}
    with FaultyReceiver(stall_s=3.0) as receiver:
        engine = EngineProcess(rounds * (phase_s + 0.5) * len(modes) + 60,
                               "--otlp-endpoint", receiver.endpoint)
        try:
            time.sleep(1.0)
            for _ in range(rounds):
                for mode in modes:
                    receiver.mode = mode
                    time.sleep(0.5)
                    start = time.monotonic()
                    time.sleep(phase_s)
                    rates[mode].append(engine.ticks_per_s(start, time.monotonic()))
            errors = engine.windows[-1]["errors"] if engine.windows else {}
        finally:
            receiver.mode = "ok"
            engine.close()
    median = {mode: statistics.median(values) for mode, values in rates.items()}
    return {"phase_s": phase_s, "rounds": rounds,
            "ticks_per_s_median": {m: round(v, 1) for m, v in median.items()},
            "ratio_to_healthy": {m: round(v / median["ok"], 3) for m, v in median.items()},
            "otlp_failures_counted": errors.get("telemetry.otlp", 0),
            "healthy_exports": receiver.attempts["ok"]}


# --- soak ------------------------------------------------------------------------------


def rss_bytes() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def soak(events: int, keys: int, batch: int = 16, report: Callable[[str], None] = print
         ) -> dict[str, Any]:
    """``events`` keyed block events over ``keys`` distinct keys through one host tier.

    Each round of a batch of ``batch`` keys: store (offload), reuse (onload) of half of
    them, evict. Keys cycle over ``keys`` so every key is seen ``events / keys`` times;
    with more distinct keys than the thrash tracker holds (2^18), it forgets the oldest.
    """
    from kvobs.recorder import Recorder
    from kvobs.telemetry.series import snapshot_series

    rec = Recorder(engine="soak", model="m", clock_ns=time.monotonic_ns)
    host = rec.add_tier("host", capacity_blocks=keys, block_tokens=16, block_bytes=4096)
    gc.collect()
    start_rss = rss_bytes()
    samples = []
    done, key, start = 0, 0, time.perf_counter()
    next_report = events // 10
    while done < events:
        batch_keys = [(key + i) % keys for i in range(batch)]
        key = (key + batch) % keys
        host.store(batch, keys=batch_keys)
        host.reuse(batch // 2, keys=batch_keys[: batch // 2])
        if key % (4 * batch) == 0:  # evict a quarter of what was stored: the rest stays
            host.evict(batch, keys=batch_keys)
        done += batch + batch // 2 + (batch if key % (4 * batch) == 0 else 0)
        if done >= next_report:
            samples.append(rss_bytes() - start_rss)
            report(f"soak: {done:>10} events, RSS +{samples[-1] / 2**20:.1f} MiB")
            next_report += events // 10
    seconds = time.perf_counter() - start
    snap = rec.snapshot()
    return {"events": done, "keys": keys, "seconds": round(seconds, 1),
            "rss_growth_mib": round((rss_bytes() - start_rss) / 2**20, 1),
            "rss_growth_second_half_mib": round((samples[-1] - samples[len(samples) // 2 - 1])
                                                / 2**20, 1) if len(samples) > 1 else 0.0,
            "tracked_blocks": snap.thrash.tracked_blocks,
            "untracked_blocks": snap.thrash.untracked_blocks,
            "exported_untracked": snapshot_series(snap)["kvobs_thrash_untracked_blocks_total"],
            "buffered_durations": sum(len(d) for d in host.residency.drain())
            if host.residency is not None else 0}


def drain(seconds: float) -> dict[str, Any]:
    """Collection time after ``seconds`` of the unpaced demo loop vs right after another,
    for a ``/metrics`` scrape alone and for a scrape with an OTLP bridge subscribed (which
    records every new sample into the OpenTelemetry SDK too), in one run."""
    import torch
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from prometheus_client import CollectorRegistry, generate_latest

    from kvobs.pool import ServingLoop, TieredKVPool
    from kvobs.pool.workload import ChatWorkload, WorkloadConfig
    from kvobs.presets import preset_layout
    from kvobs.recorder import Recorder
    from kvobs.telemetry.exposition import SnapshotCollector
    from kvobs.telemetry.otel import OtelBridge

    torch.set_num_threads(1)
    layout = preset_layout("qwen2.5-0.5b")
    rec = Recorder(engine="drain", model=layout.name)
    pool = TieredKVPool(layout, 512, 2048, rec)
    loop = ServingLoop(pool, ChatWorkload(WorkloadConfig(rate=20.0), seed=7))
    loop.run(30.0, pace=False)
    registry = CollectorRegistry()
    registry.register(SnapshotCollector(rec))

    def pending() -> int:
        return sum(len(link.durations) for link in rec.links) + sum(
            len(tracker._residency) + len(tracker._gaps)
            for tracker in (rec.tier(name).residency for name in rec.tier_names) if tracker)

    def run_then_collect() -> dict[str, float]:
        generate_latest(registry)
        start, ticks = time.perf_counter(), 0
        while time.perf_counter() - start < seconds:
            loop.step()
            ticks += 1
        elapsed, samples = time.perf_counter() - start, pending()
        begin = time.perf_counter()
        generate_latest(registry)
        full = time.perf_counter() - begin
        begin = time.perf_counter()
        generate_latest(registry)
        empty = time.perf_counter() - begin
        per_sample = (full - empty) / max(samples, 1)
        return {"ticks_per_s": round(ticks / elapsed, 1), "samples": samples,
                "collect_after_ms": round(full * 1e3, 1),
                "collect_empty_ms": round(empty * 1e3, 1),
                "us_per_sample": round(per_sample * 1e6, 2),
                "engine_share": round(per_sample * samples / elapsed, 4)}

    scrape = run_then_collect()
    reader = InMemoryMetricReader()
    bridge = OtelBridge(rec, [reader])
    with_otlp = run_then_collect()
    bridge.shutdown()
    return {"seconds": seconds, "metrics_only": scrape, "with_otlp_bridge": with_otlp}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    load = sub.add_parser("scrape-load")
    load.add_argument("--seconds", type=float, default=60.0, help="total time, both phases")
    load.add_argument("--scrapers", type=int, default=16)
    load.add_argument("--phase", type=float, default=5.0)
    load.add_argument("--interval", type=float, default=0.0,
                      help="seconds between one scraper's scrapes (0: back to back)")
    load.add_argument("--server", choices=("plain", "coalesced", "both"), default="both")
    load.add_argument("--nice", type=int, default=0,
                      help="run the scrapers at this niceness (19: they stand in for a "
                           "Prometheus on another host)")
    many = sub.add_parser("engines")
    many.add_argument("--engines", type=int, default=8)
    many.add_argument("--scrapes", type=int, default=200)
    faults = sub.add_parser("sink-faults")
    faults.add_argument("--phase", type=float, default=2.0)
    faults.add_argument("--rounds", type=int, default=8)
    long = sub.add_parser("soak")
    long.add_argument("--events", type=int, default=10_000_000)
    long.add_argument("--keys", type=int, default=1_000_000)
    vllm = sub.add_parser("vllm-scrape", help="run with .venv-vllm/bin/python")
    vllm.add_argument("--blocks", type=int, default=100_000)
    vllm.add_argument("--scrapes", type=int, default=40)
    drained = sub.add_parser("drain")
    drained.add_argument("--seconds", type=float, default=2.0)
    args = parser.parse_args(argv)
    if args.command == "drain":
        print(json.dumps(drain(args.seconds)))
        return 0
    if args.command == "scrape-load":
        servers = ("plain", "coalesced") if args.server == "both" else (args.server,)
        for server in servers[:-1]:
            print(json.dumps(scrape_load(args.seconds, args.scrapers, args.phase,
                                         args.interval, server, args.nice)), flush=True)
        result = scrape_load(args.seconds, args.scrapers, args.phase, args.interval,
                             servers[-1], args.nice)
    elif args.command == "engines":
        result = engines_scrape(args.engines, args.scrapes)
    elif args.command == "vllm-scrape":
        result = vllm_scrape(args.blocks, args.scrapes)
    elif args.command == "sink-faults":
        result = sink_faults(args.phase, args.rounds)
    else:
        result = soak(args.events, args.keys, report=lambda line: print(line, file=sys.stderr))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
