"""Load on /metrics: 16 concurrent scrapers, scrapers hanging up, 8 engines on one endpoint.

Real servers: ``kvobs demo`` subprocesses (tests/e2e/e2e_servers.py) and the unpaced
engine process of benchmarks/reliability_engine.py. Each test is bounded (10-15 s of
load); the README's figures come from the 60 s runs of ``benchmarks/reliability.py``.
Bounds are generous and say why: this is a 2-core machine shared with other tests.
"""

from __future__ import annotations

import socket
import struct
import time
import urllib.request
from pathlib import Path

import pytest

from benchmarks.reliability import Scrapers, engines_scrape, percentile, scrape_load
from tests.e2e.e2e_servers import DEMO_ARGS, start_demo

SCRAPERS = 16


def complete(body: bytes) -> bool:
    return b"kvobs_lookups_total{" in body and body.endswith(b"\n")


def test_sixteen_scrapers_against_the_demo_get_every_answer(tmp_path: Path) -> None:
    # The demo's busiest setting: 20 new conversations a second keep the pools churning.
    demo = start_demo(tmp_path, 60, "--gpu-blocks", "512", "--host-blocks", "2048",
                      "--rate", "20", "--summary-interval", "0", "--seed", "7")
    try:
        # Each scraper every 0.25 s: 64 scrapes a second, ~60x a Prometheus at 15 s.
        pool = Scrapers(demo.url + "/metrics", SCRAPERS, interval_s=0.25, check=complete)
        pool.active.set()
        time.sleep(10)
        pool.active.clear()
        pool.stop()
        assert demo.process.poll() is None, demo.log.read_text()[-2000:]
    finally:
        demo.stop()
    assert pool.errors == [], pool.errors[:3]
    assert len(pool.latencies) >= 100  # the scrapers really ran (>= 600 on a quiet machine)
    # Prometheus's default scrape timeout is 10 s; p99 here is well under a second.
    assert percentile(pool.latencies, 0.99) < 10
    assert "Traceback" not in demo.log.read_text()


def test_scrapers_hanging_up_mid_response_leave_the_demo_serving(tmp_path: Path) -> None:
    demo = start_demo(tmp_path, 60, *DEMO_ARGS)
    port = int(demo.url.rsplit(":", 1)[1])
    try:
        for _ in range(20):
            with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
                sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
                sock.recv(100)  # the status line and a little of the body
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            # closed with RST while the server is still writing
        for _ in range(5):  # and ones that hang up before sending a whole request
            with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
                sock.sendall(b"GET /metr")
        with urllib.request.urlopen(demo.url + "/metrics", timeout=10) as response:
            assert response.status == 200 and complete(response.read())
        assert demo.process.poll() is None
    finally:
        demo.stop()
    assert "Traceback" not in demo.log.read_text()


@pytest.mark.parametrize("server", ["plain", "coalesced"])
def test_engine_at_full_rate_loses_little_to_sixteen_scrapers(server: str) -> None:
    # Scrapers on and off in 2 s phases for 12 s, each scraping every second (16/s in
    # all). Measured here over 60 s: see the README. The bound (25%) only catches the
    # engine being starved; back-to-back scraping is in the benchmark, not here.
    result = scrape_load(seconds=12, scrapers=SCRAPERS, phase_s=2.0, interval_s=1.0,
                         server=server)
    assert result["errors"] == 0, result
    assert result["scrapes"] >= 50, result
    assert result["engine_loss"] < 0.25, result


def test_eight_engines_on_one_endpoint_scrape_within_bounds() -> None:
    result = engines_scrape(engines=8, scrapes=40)
    assert result["samples"] > 800  # 8 engines x 3 tiers x every series kind
    # The README's figures come from the benchmark; this bound catches a return to a
    # path an order of magnitude slower (the OpenTelemetry SDK took 25-40 ms here).
    assert result["p50_ms"] < 60, result


def test_eight_engines_render_within_5x_of_a_direct_render() -> None:
    # The goal's ratio for what kvobs does per scrape (one collection of 8 engines x 3
    # tiers, written as text) against rendering the same counters straight from their
    # snapshots, side by side in one run (each round takes one of each), so a loaded
    # machine slows both. The HTTP p50 itself is the benchmark's figure (README).
    result = engines_scrape(engines=8, scrapes=40)
    assert result["render_p50_ms"] <= 5 * result["direct_render_p50_ms"], result
    assert result["generate_latest_over_render"] > 1, result  # kvobs's writer is the faster
