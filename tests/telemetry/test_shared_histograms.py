"""Readers of one recorder share its samples: a scrape never takes them from OTLP, and
a broken source is counted while the scrape goes on; a broken snapshot answers 500."""

from __future__ import annotations

import threading
import urllib.error
import urllib.request

import pytest
import structlog
from opentelemetry.sdk.metrics.export import HistogramDataPoint, InMemoryMetricReader
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kvobs.recorder import Recorder
from kvobs.telemetry.exposition import SnapshotCollector
from kvobs.telemetry.otel import OtelBridge
from kvobs.telemetry.prometheus import start_metrics_server

DURATION = "kvobs_transfer_duration_seconds"


def scraped(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(registry).decode()
    return {(s.name, tuple(sorted((k, v) for k, v in s.labels.items()
                                  if k not in ("engine", "model")))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def otel_histogram(reader: InMemoryMetricReader, name: str) -> HistogramDataPoint:
    data = reader.get_metrics_data()
    points = [p for rm in data.resource_metrics for sm in rm.scope_metrics
              for m in sm.metrics if m.name == name for p in m.data.data_points]
    assert len(points) == 1, points
    point = points[0]
    assert isinstance(point, HistogramDataPoint)
    return point


def registry_of(rec: Recorder, **kwargs: object) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(SnapshotCollector(rec, **kwargs))  # type: ignore[arg-type]
    return registry


def test_a_scrape_and_an_otel_reader_each_see_every_sample() -> None:
    rec = Recorder(engine="e", model="m")
    link = rec.link("host", "gpu")
    registry, reader = registry_of(rec), InMemoryMetricReader()
    bridge = OtelBridge(rec, [reader])
    try:
        for seconds in (0.001, 0.002, 0.004):
            link.transfer(1, 1024, seconds)
        first = scraped(registry)  # drains the buffer first
        link.transfer(1, 1024, 0.008)
        point = otel_histogram(reader, "kvobs_transfer_duration")
        second = scraped(registry)
    finally:
        bridge.shutdown()
    where = (("dst_tier", "gpu"), ("src_tier", "host"))
    assert first[(f"{DURATION}_count", where)] == 3
    assert second[(f"{DURATION}_count", where)] == point.count == 4
    assert second[(f"{DURATION}_sum", where)] == point.sum == 0.015
    le = (("dst_tier", "gpu"), ("le", "0.0025"), ("src_tier", "host"))
    assert second[(f"{DURATION}_bucket", le)] == 2


def test_histograms_never_go_backwards_while_the_engine_records() -> None:
    rec = Recorder(engine="e", model="m")
    link = rec.link("gpu", "host")
    registry, stop = registry_of(rec), threading.Event()
    recorded = [0]

    def engine() -> None:
        while not stop.is_set():
            link.transfer(1, 64, 0.0005)
            recorded[0] += 1

    thread = threading.Thread(target=engine)
    thread.start()
    counts = []
    try:
        for _ in range(50):
            counts.append(scraped(registry)[(f"{DURATION}_count",
                                             (("dst_tier", "host"), ("src_tier", "gpu")))])
    finally:
        stop.set()
        thread.join()
    assert counts == sorted(counts) and counts[-1] > 0
    final = scraped(registry)[(f"{DURATION}_count", (("dst_tier", "host"), ("src_tier", "gpu")))]
    # every transfer is a sample, or a counted drop once the buffer is full between scrapes
    assert final + link.dropped_samples == recorded[0] == link.operations


def test_a_failing_source_is_counted_and_the_scrape_keeps_the_rest() -> None:
    rec = Recorder(engine="e", model="m")
    rec.add_tier("gpu", capacity_blocks=8, block_tokens=16, block_bytes=64).allocate(2)

    def broken() -> dict[str, list[tuple[dict[str, str], float]]]:
        raise RuntimeError("NVML went away")

    with structlog.testing.capture_logs():
        samples = scraped(registry_of(rec, sources=[broken]))
    assert samples[("kvobs_block_allocations_total", (("tier", "gpu"),))] == 2
    assert rec.snapshot().errors == {"telemetry.source": 1}


def test_a_failing_snapshot_answers_500_with_one_line_and_is_counted() -> None:
    rec = Recorder(engine="e", model="m")
    gpu = rec.add_tier("gpu", capacity_blocks=8, block_tokens=16, block_bytes=64)

    def unreadable() -> tuple[int, int]:
        raise ValueError("engine state unreadable")

    gpu.set_resident_source(unreadable)
    server = start_metrics_server("127.0.0.1:0")
    server.attach(rec)
    try:
        with structlog.testing.capture_logs(), pytest.raises(urllib.error.HTTPError) as failed:
            urllib.request.urlopen(server.url, timeout=10)
        body = failed.value.read().decode()
        assert failed.value.code == 500
        assert body.count("\n") == 1 and "engine state unreadable" in body, body
        gpu.set_resident_source(None)  # readable again: the next scrape is whole
        assert rec.snapshot().errors == {"telemetry.prometheus": 1}
        with urllib.request.urlopen(server.url, timeout=10) as response:
            assert b'kvobs_tier_capacity_blocks{engine="e",model="m",tier="gpu"} 8.0' in \
                response.read()
    finally:
        server.close()
