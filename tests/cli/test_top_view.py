"""``kvobs top`` without a terminal: rates, quantiles, layouts, unreachable endpoints."""

import io
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console

from kvobs.report.palette import DIRECTIONS, TIERS
from kvobs.top import Watcher, build_view, parse_text, run_top
from kvobs.top.model import quantile
from kvobs.top.render import render_view

HERE = Path(__file__).resolve().parent


def exposition(allocs, lookups, transfers, buckets, drops=0, thrash=0):
    rows = [
        'kvobs_tier_capacity_blocks{engine="e",model="m",tier="host"} 400',
        'kvobs_tier_capacity_blocks{engine="e",model="m",tier="gpu"} 100',
        'kvobs_tier_resident_blocks{engine="e",model="m",tier="gpu",state="in_use"} 50',
        'kvobs_tier_resident_blocks{engine="e",model="m",tier="gpu",state="cached"} 25',
        'kvobs_tier_resident_blocks{engine="e",model="m",tier="host",state="cached"} 100',
        f'kvobs_block_allocations_total{{engine="e",model="m",tier="gpu"}} {allocs}',
        f'kvobs_lookups_total{{engine="e",model="m"}} {lookups}',
        f'kvobs_lookup_tokens_total{{engine="e",model="m",outcome="gpu_hit"}} {lookups * 60}',
        f'kvobs_lookup_tokens_total{{engine="e",model="m",outcome="host_hit"}} {lookups * 30}',
        f'kvobs_lookup_tokens_total{{engine="e",model="m",outcome="miss"}} {lookups * 10}',
        f'kvobs_transfer_bytes_total{{engine="e",model="m",src_tier="gpu",dst_tier="host"}} '
        f"{transfers * 1000}",
        f'kvobs_transfer_blocks_total{{engine="e",model="m",src_tier="gpu",dst_tier="host"}} '
        f"{transfers}",
        f'kvobs_transfer_drops_total{{engine="e",model="m",src_tier="gpu",dst_tier="host"}} '
        f"{drops}",
        f'kvobs_thrash_onloads_total{{engine="e",model="m"}} {thrash}',
        'kvobs_offloaded_reused_blocks_total{engine="e",model="m"} 30',
        'kvobs_offloaded_evicted_unused_blocks_total{engine="e",model="m"} 10',
    ]
    for le, count in buckets.items():
        rows.append(
            f'kvobs_transfer_duration_seconds_bucket{{engine="e",model="m",src_tier="gpu",'
            f'dst_tier="host",le="{le}"}} {count}'
        )
    return "\n".join(rows) + "\n"


def test_rates_come_from_successive_scrapes():
    first = parse_text(exposition(10, 5, 100, {"0.001": 4, "0.01": 10, "+Inf": 10}), 100.0)
    second = parse_text(
        exposition(30, 9, 300, {"0.001": 4, "0.01": 20, "+Inf": 20}, drops=3, thrash=2), 102.0
    )
    view = build_view(second, first)
    assert view.title == "e · m" and view.interval_s == 2.0
    assert [t.name for t in view.tiers] == ["gpu", "host"]  # fastest first
    gpu = view.tiers[0]
    assert (gpu.in_use, gpu.cached, gpu.free) == (50, 25, 25)
    assert not view.hits_since_start
    assert view.lookup_tokens == {
        "gpu_hit": 120.0, "host_hit": 60.0, "disk_hit": 0.0, "miss": 20.0
    }
    assert view.lookups_per_s == 2.0
    (link,) = view.transfers
    assert (link.src, link.dst, link.bytes_per_s, link.blocks_per_s) == ("gpu", "host", 1e5, 100)
    # only the 10 transfers of the interval count, all between 1 and 10 ms
    assert not link.latency_since_start and 0.001 < link.p50_s < link.p99_s <= 0.01
    assert link.drops_per_s == 1.5 and link.drops == 3
    assert view.thrash_per_s == 1.0 and view.wasted_share == 0.25


def test_first_scrape_has_totals_and_a_reset_counter_is_not_negative():
    first = parse_text(exposition(10, 5, 100, {"0.001": 4, "+Inf": 4}), 1.0)
    view = build_view(first, None)
    assert view.hits_since_start and view.lookup_tokens["gpu_hit"] == 300
    assert view.transfers[0].latency_since_start and view.interval_s is None
    restarted = parse_text(exposition(2, 1, 10, {"0.001": 1, "+Inf": 1}), 2.0)
    view = build_view(restarted, first)
    assert view.transfers[0].bytes_per_s == 10_000  # the counter restarted from 0
    assert all(v >= 0 for v in view.lookup_tokens.values())


def test_quantile_interpolates_like_promql():
    buckets = {0.001: 50, 0.002: 100, math.inf: 100}
    assert quantile(0.5, buckets) == 0.001
    assert quantile(0.75, buckets) == pytest.approx(0.0015)
    assert quantile(0.5, {math.inf: 0}) is None


@pytest.mark.parametrize("width", [40, 60, 91, 92, 140])
def test_every_width_reads(width):
    view = build_view(
        parse_text(exposition(30, 9, 300, {"0.001": 4, "0.01": 20, "+Inf": 20}), 2.0),
        parse_text(exposition(10, 5, 100, {"0.001": 4, "0.01": 10, "+Inf": 10}), 1.0),
    )
    console = Console(width=width, record=True, color_system=None, file=io.StringIO())
    console.print(render_view(view, width))
    lines = console.export_text().splitlines()
    assert max(len(line) for line in lines) <= width
    text = "\n".join(lines)
    for needle in ("gpu", "host", "gpu→host", "p50", "p99", "thrash", "wasted offloads 25%"):
        assert needle in text, (needle, text)
    assert "gpu 60%" in text and "host 30%" in text and "miss 10%" in text


def test_tier_and_direction_colours_are_the_palette():
    view = build_view(parse_text(exposition(1, 1, 1, {"+Inf": 1}), 1.0), None)
    console = Console(width=120, record=True, color_system="truecolor",
                      file=io.StringIO())
    console.print(render_view(view, 120))
    html = console.export_html(inline_styles=True)
    for color in (TIERS["gpu"], TIERS["host"], DIRECTIONS[("gpu", "host")]):
        assert color.lower() in html.lower()


def test_unreachable_endpoint_is_shown_and_retried(capsys):
    watcher = Watcher(["http://127.0.0.1:1/metrics"], timeout_s=0.5)
    console = Console(width=80, record=True, color_system=None, file=io.StringIO())
    for _ in range(2):
        console.print(watcher.frame(80, ""))
    text = console.export_text()
    assert "unreachable" in text and "2 failed so far" in text
    watcher.close()
    assert run_top(["http://127.0.0.1:1/metrics"], once=True, interval_s=0.1,
                   console=console) == 1


@pytest.fixture(scope="module")
def busy_url(tmp_path_factory):
    url_file = tmp_path_factory.mktemp("busy") / "url"
    proc = subprocess.Popen([sys.executable, str(HERE / "busy_engine.py"), str(url_file)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not (url_file.exists() and url_file.read_text()):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"busy engine did not start: {proc.stderr.read()}")
        time.sleep(0.1)
    yield url_file.read_text()
    proc.terminate()
    proc.wait(timeout=10)


def test_once_off_a_terminal_prints_one_frame_with_rates(busy_url):
    result = subprocess.run(
        [sys.executable, "-m", "kvobs", "top", "--once", "--url", busy_url, "--interval", "0.5"],
        capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "100"},
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "busy · qwen2.5-0.5b" in out and "rates over 0." in out
    assert "gpu→host" in out and "host→gpu" in out and "hits (last interval)" in out
    assert "\x1b[" not in out  # no escape codes into a pipe


def test_an_endpoint_that_is_not_kvobs_says_so():
    import http.server
    import threading

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = b"up 1\n" if self.path == "/metrics" else b"nope"
            self.send_response(200 if self.path == "/metrics" else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        from kvobs.top import fetch

        assert fetch(f"{base}/metrics").error == "answered, but with no kvobs_* metrics"
        assert fetch(f"{base}/other").error == "HTTP 404 Not Found"
    finally:
        server.shutdown()
        server.server_close()
