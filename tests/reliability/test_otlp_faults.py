"""OTLP push against a real receiver that refuses, stalls, black-holes, answers 5xx, recovers.

While an engine thread bumps counters flat out, the receiver goes through every fault.
Checked at each phase: failures are counted (``kvobs_instrumentation_errors_total
{component="telemetry.otlp"}`` on /metrics), the engine keeps its event rate, no thread
piles up, memory stays flat; after recovery the next export carries the exact counters.

Bounds are generous on purpose (2-core CI machine, other test processes running): the
precise side-by-side figures come from ``benchmarks/reliability.py sink-faults``.
"""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Callable, Iterator

import pytest
import structlog

from kvobs.recorder import Recorder
from kvobs.telemetry.otel import OtelBridge
from kvobs.telemetry.otlp import otlp_reader
from kvobs.telemetry.prometheus import start_metrics_server
from tests.reliability.faulty_receiver import FaultyReceiver

INTERVAL_S = 0.2
TIMEOUT_S = 0.5  # the receiver stalls for 3 s: well past it


class Engine:
    """A thread calling the recorder like an allocator does, counting its events."""

    def __init__(self, recorder: Recorder) -> None:
        self.tier = recorder.add_tier("gpu", capacity_blocks=1024, block_tokens=16,
                                      block_bytes=4096)
        self.events = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="engine")

    def _run(self) -> None:
        tier = self.tier
        while not self._stop.is_set():
            for _ in range(500):
                tier.allocate(1)
                tier.free(1, cached=True)
                tier.reuse(1)
                tier.free(1)
            self.events += 2000

    def rate(self, seconds: float) -> float:
        """Events per second over the next ``seconds``."""
        start_events, start = self.events, time.perf_counter()
        time.sleep(seconds)
        return (self.events - start_events) / (time.perf_counter() - start)

    def __enter__(self) -> Engine:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def rss_bytes() -> int:
    with open("/proc/self/statm") as handle:
        import os

        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def our_threads() -> int:
    """Threads of this process other than the receiver's own request handlers."""
    return sum(1 for t in threading.enumerate() if "process_request_thread" not in t.name)


def wait_for(what: str, condition: Callable[[], bool], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.05)


@pytest.fixture
def pushing() -> Iterator[tuple[FaultyReceiver, Recorder, OtelBridge, str]]:
    recorder = Recorder(engine="faults", model="m")
    with FaultyReceiver(stall_s=3.0) as receiver, structlog.testing.capture_logs():
        server = start_metrics_server("127.0.0.1:0")
        reader = otlp_reader(receiver.endpoint, recorder, interval_s=INTERVAL_S,
                             timeout_s=TIMEOUT_S)
        server.attach(recorder)
        bridge = OtelBridge(recorder, [reader])
        try:
            yield receiver, recorder, bridge, server.url
        finally:
            bridge.shutdown()
            server.close()


def otlp_failures(recorder: Recorder) -> int:
    return recorder.snapshot().errors.get("telemetry.otlp", 0)


def scraped_failures(url: str) -> float:
    with urllib.request.urlopen(url, timeout=10) as response:
        for line in response.read().decode().splitlines():
            if line.startswith("kvobs_instrumentation_errors_total{") and \
                    'component="telemetry.otlp"' in line:
                return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_every_fault_is_counted_and_export_resumes(pushing) -> None:  # type: ignore[no-untyped-def]
    receiver, recorder, _, url = pushing
    with Engine(recorder) as engine:
        wait_for("a first export", lambda: len(receiver.requests) >= 2)
        healthy = engine.rate(1.0)
        threads, rss = our_threads(), rss_bytes()
        rates = {}
        for mode in ("refuse", "5xx", "stall", "blackhole"):
            before = otlp_failures(recorder)
            receiver.mode = mode
            start = time.monotonic()
            rates[mode] = engine.rate(1.0)
            # At least two exports failed in this mode (each within TIMEOUT_S + backoff).
            wait_for(f"failures while {mode}", lambda b=before: otlp_failures(recorder) >= b + 2)
            assert time.monotonic() - start < 15
            # One export thread, not one per interval: nothing piles up behind a fault.
            assert our_threads() <= threads + 1, [t.name for t in threading.enumerate()]
        assert receiver.attempts["5xx"] >= 2 and receiver.attempts["blackhole"] >= 1
        assert scraped_failures(url) >= otlp_failures(recorder) - 2 > 0  # on /metrics too
        # Engine rate: a fault costs the engine nothing it can see. The bound (half the
        # healthy rate) only catches a blocked engine; the benchmark gives the real ratio.
        for mode, rate in rates.items():
            assert rate > 0.5 * healthy, (mode, rate, healthy)
        # Memory: nothing queued while the collector was away (bound: 32 MiB of noise).
        assert rss_bytes() - rss < 32 * 2**20

        receiver.mode = "ok"
        seen = len(receiver.requests)
        wait_for("export to resume", lambda: len(receiver.requests) >= seen + 2)
    # Cumulative counters: the exports after recovery carry everything counted during the
    # outage; once the engine stops, the exported count is exactly the recorder's.
    wait_for("the final counters", lambda: receiver.latest_sum(
        "kvobs_block_allocations", tier="gpu") == engine.tier.allocations)


def test_shutdown_is_bounded_while_the_collector_black_holes(pushing) -> None:  # type: ignore[no-untyped-def]
    receiver, recorder, bridge, _ = pushing
    wait_for("a first export", lambda: len(receiver.requests) >= 1)
    receiver.mode = "blackhole"
    wait_for("a held export", lambda: receiver.attempts["blackhole"] >= 1)
    start = time.monotonic()
    bridge.shutdown()  # the in-flight export and the final one, each within TIMEOUT_S
    # 2 exports x 0.5 s plus scheduling; 10 s is far beyond and still catches a hang
    # (the SDK's own default would wait 30 s).
    assert time.monotonic() - start < 10
    assert otlp_failures(recorder) >= 1
