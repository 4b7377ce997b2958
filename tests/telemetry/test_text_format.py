"""kvobs writes Prometheus's text format itself: byte for byte what prometheus_client's
own ``generate_latest`` writes for the same families (every kind of series kvobs
exports, labels that need escaping, OpenMetrics-only samples)."""

from __future__ import annotations

import gzip
import urllib.request

import structlog
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric

from kvobs.recorder import Recorder
from kvobs.telemetry.exposition import SnapshotCollector
from kvobs.telemetry.prometheus import start_metrics_server
from kvobs.telemetry.text import render
from tests.telemetry.scripted import scripted_recorder


def awkward_recorder() -> Recorder:
    rec = Recorder(engine="e", model='we"ird\\model\nname', labels={"dp_rank": "0"})
    rec.add_tier("gpu", capacity_blocks=2**53, block_tokens=16, block_bytes=2**21).allocate(7)
    rec.link("gpu", "host").transfer(1, 10**17, 1e-7)
    with structlog.testing.capture_logs():
        rec.error("a.component")
    return rec


def test_render_is_prometheus_clients_text_format() -> None:
    for rec in (scripted_recorder(), awkward_recorder()):
        registry = CollectorRegistry()

        def nvml() -> dict[str, list[tuple[dict[str, str], float]]]:
            return {"kvobs_gpu_memory_total_bytes": [({"gpu": "0"}, 8.5e10)]}

        registry.register(SnapshotCollector(rec, [nvml]))
        families = list(registry.collect())
        assert len(families) > 10
        assert render(families) == generate_latest(registry)


def test_openmetrics_only_samples_go_last_as_prometheus_client_puts_them() -> None:
    family = Metric("jobs", "Jobs\\done.\nSecond line.", "counter")
    family.add_sample("jobs_total", {"b": "2", "a": "1"}, 5, timestamp=12.5)
    family.add_sample("jobs_created", {"a": "1"}, 1.7e9)
    info = Metric("build", "Build.", "info")
    info.add_sample("build_info", {"v": "1"}, 1)

    class Fixed:
        def collect(self):  # type: ignore[no-untyped-def]
            return [family, info]

    registry = CollectorRegistry()
    registry.register(Fixed())  # type: ignore[arg-type]
    assert render([family, info]) == generate_latest(registry)


def test_the_server_gzips_and_filters_by_name_when_asked() -> None:
    rec = scripted_recorder()
    server = start_metrics_server("127.0.0.1:0")
    server.attach(rec)
    try:
        plain = urllib.request.urlopen(server.url, timeout=10).read()
        request = urllib.request.Request(server.url, headers={"Accept-Encoding": "gzip"})
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.headers["Content-Encoding"] == "gzip"
            assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            assert gzip.decompress(response.read()) == plain
        only = urllib.request.urlopen(server.url + "?name[]=kvobs_lookups_total",
                                      timeout=10).read().decode()
        assert [line.split("{")[0] for line in only.splitlines()
                if not line.startswith("#")] == ["kvobs_lookups_total"]
    finally:
        server.close()
