"""CoalescingApp: scrapes share collections, at most one per interval, variants apart;
the one /metrics server coalesces with or without a web config."""

from __future__ import annotations

import threading
import time
import urllib.request

import pytest

from kvobs.errors import ConfigError
from kvobs.recorder import Recorder
from kvobs.telemetry.coalesce import MIN_INTERVAL_S, CoalescingApp
from kvobs.telemetry.prometheus import start_metrics_server


class SlowMetrics:
    """A metrics app whose collection takes ``seconds`` and counts itself."""

    def __init__(self, seconds: float = 0.0) -> None:
        self.seconds, self.calls = seconds, 0
        self.lock = threading.Lock()

    def __call__(self, environ, start_response):  # type: ignore[no-untyped-def]
        with self.lock:
            self.calls += 1
            n = self.calls
        time.sleep(self.seconds)
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [f"collections {n} {environ.get('HTTP_ACCEPT', '')}\n".encode()]


def get(app, accept: str = "") -> bytes:  # type: ignore[no-untyped-def]
    env = {"REQUEST_METHOD": "GET", "PATH_INFO": "/metrics", "HTTP_ACCEPT": accept}
    return b"".join(app(env, lambda status, headers: None))


def test_at_most_one_collection_per_interval() -> None:
    now = [100.0]
    metrics = SlowMetrics()
    app = CoalescingApp(metrics, min_interval_s=1.0, clock=lambda: now[0])
    assert get(app) == get(app) == b"collections 1 \n"
    now[0] += 0.99
    assert get(app) == b"collections 1 \n"
    now[0] += 0.02
    assert get(app) == b"collections 2 \n"
    openmetrics = "application/openmetrics-text"
    assert get(app, openmetrics) == f"collections 3 {openmetrics}\n".encode()
    assert metrics.calls == 3


def test_concurrent_scrapes_share_one_collection_even_without_caching() -> None:
    metrics = SlowMetrics(seconds=0.3)
    app = CoalescingApp(metrics, min_interval_s=0)
    bodies: list[bytes] = []
    first = threading.Thread(target=lambda: bodies.append(get(app)))
    first.start()
    time.sleep(0.1)  # the first collection is running: these wait for it, or the next
    others = [threading.Thread(target=lambda: bodies.append(get(app))) for _ in range(8)]
    for thread in others:
        thread.start()
    for thread in (first, *others):
        thread.join(timeout=10)
    assert len(bodies) == 9
    # Bound: 9 scrapes, at most 2 collections (the running one, then one for all waiters
    # that arrived during it), whatever the scheduling on a loaded machine.
    assert metrics.calls <= 2
    assert get(app) != bodies[0]  # min_interval 0: a later scrape collects again


def test_other_methods_pass_through() -> None:
    metrics = SlowMetrics()
    app = CoalescingApp(metrics, min_interval_s=60)
    env = {"REQUEST_METHOD": "OPTIONS", "PATH_INFO": "/metrics"}
    b"".join(app(env, lambda status, headers: None))
    b"".join(app(env, lambda status, headers: None))
    assert metrics.calls == 2


def test_bad_interval_is_named() -> None:
    with pytest.raises(ConfigError, match="scrape min interval must be >= 0"):
        CoalescingApp(SlowMetrics(), min_interval_s=-1)
    with pytest.raises(ConfigError, match="scrape min interval"):
        start_metrics_server("127.0.0.1:0", min_interval_s=float("nan"))


def test_plain_server_without_web_config_serves_fresh_enough_metrics() -> None:
    recorder = Recorder(engine="c", model="m")
    gpu = recorder.add_tier("gpu", capacity_blocks=8, block_tokens=16, block_bytes=64)
    server = start_metrics_server("127.0.0.1:0", min_interval_s=0.2)
    server.attach(recorder)
    try:
        assert server.url.startswith("http://127.0.0.1:")
        gpu.allocate(3)

        def scrape() -> str:
            with urllib.request.urlopen(server.url, timeout=10) as response:
                return response.read().decode()

        assert 'kvobs_block_allocations_total{engine="c",model="m",tier="gpu"} 3.0' in scrape()
        gpu.allocate(2)
        time.sleep(0.25)
        assert 'kvobs_block_allocations_total{engine="c",model="m",tier="gpu"} 5.0' in scrape()
    finally:
        server.close()


def test_a_failed_collection_is_not_kept() -> None:
    answers = iter([("500 Internal Server Error", b"kvobs: collection failed\n"),
                    ("200 OK", b"x 1\n")])

    def metrics(environ, start_response):  # type: ignore[no-untyped-def]
        status, body = next(answers)
        start_response(status, [("Content-Type", "text/plain")])
        return [body]

    app = CoalescingApp(metrics, min_interval_s=60)
    assert get(app) == b"kvobs: collection failed\n"
    assert get(app) == b"x 1\n"  # tried again at once, then kept for the interval
    assert get(app) == b"x 1\n" and app.collections == 2


def test_telemetry_serves_coalesced_by_default_and_the_variable_turns_it_off(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import structlog

    from kvobs.exporter import Telemetry

    def scrapes(environ: dict[str, str], n: int = 20) -> tuple[int, float]:
        """(collections, seconds) for ``n`` scrapes back to back."""
        for name, value in environ.items():
            monkeypatch.setenv(name, value)
        rec = Recorder(engine="c", model="m")
        rec.add_tier("gpu", capacity_blocks=8, block_tokens=16, block_bytes=64)
        with structlog.testing.capture_logs():
            telemetry = Telemetry.start(rec, structlog.get_logger("kvobs"),
                                        metrics_addr="127.0.0.1:0", summary_interval_s=0,
                                        nvml=False)
        try:
            assert telemetry.server is not None and telemetry.metrics_url is not None
            started = time.monotonic()
            for _ in range(n):
                with urllib.request.urlopen(telemetry.metrics_url, timeout=10) as response:
                    assert b"kvobs_tier_capacity_blocks" in response.read()
            return telemetry.server.app.collections, time.monotonic() - started
        finally:
            telemetry.close()

    monkeypatch.delenv("KVOBS_METRICS_MIN_INTERVAL_S", raising=False)
    collections, seconds = scrapes({})
    # At most one collection per 0.25 s, whatever the machine's pace.
    assert collections <= seconds / MIN_INTERVAL_S + 1 and collections < 20
    assert scrapes({"KVOBS_METRICS_MIN_INTERVAL_S": "0"})[0] == 20


def test_clients_that_never_speak_or_never_read_hold_no_other_scrape_up() -> None:
    import socket

    recorder = Recorder(engine="c", model="m")
    for i in range(2000):  # a response far larger than a socket buffer
        recorder.error(f"component.{i}")
    server = start_metrics_server("127.0.0.1:0")
    server.attach(recorder)
    idle: list[socket.socket] = []
    try:
        for _ in range(4):
            idle.append(socket.create_connection(("127.0.0.1", server.port), timeout=10))
        for _ in range(4):  # asks, never reads: the server's writer blocks on a full buffer
            sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            idle.append(sock)
        started = time.monotonic()
        with urllib.request.urlopen(server.url, timeout=10) as response:
            assert response.status == 200 and b"component.1999" in response.read()
        assert time.monotonic() - started < 5  # not queued behind the silent ones
    finally:
        for sock in idle:
            sock.close()
        server.close()
