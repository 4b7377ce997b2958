"""A failure in any sink or analysis is counted and logged; the engine's calls go on."""

import structlog
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from kvobs.telemetry.otel import OtelBridge
from kvobs.telemetry.summary import SummaryLogger
from tests.telemetry.scripted import scripted_recorder


def metric_names(reader):
    data = reader.get_metrics_data()
    return {m.name for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}


def test_failing_series_source_is_counted_and_the_rest_exports():
    rec = scripted_recorder()

    def broken_source():
        raise RuntimeError("NVML went away")

    reader = InMemoryMetricReader()
    with structlog.testing.capture_logs() as logs:
        bridge = OtelBridge(rec, [reader], sources=[broken_source])
        names = metric_names(reader)
    assert "kvobs_lookup_tokens" in names
    assert rec.snapshot().errors == {"telemetry.source": 1}
    assert any(e["event"] == "instrumentation_error" for e in logs)
    rec.tier("gpu").allocate(1)  # the hot path is untouched
    bridge.shutdown()


def test_failing_snapshot_during_collection_does_not_raise():
    rec = scripted_recorder()
    gpu = rec.tier("gpu")

    def broken_resident():
        raise ValueError("engine state unreadable")

    gpu.set_resident_source(broken_resident)
    reader = InMemoryMetricReader()
    with structlog.testing.capture_logs():
        bridge = OtelBridge(rec, [reader])
        reader.get_metrics_data()
    gpu.allocate(3)
    gpu.set_resident_source(None)
    assert rec.snapshot().errors["telemetry.otel"] >= 1
    assert rec.snapshot().tier("gpu").allocations == 13
    bridge.shutdown()


def test_broken_summary_logger_is_counted():
    rec = scripted_recorder()

    class BrokenLogger:
        def info(self, *args, **kwargs):
            raise OSError("disk full")

    summary = SummaryLogger(rec, BrokenLogger(), interval_s=0.01).start()
    try:
        for _ in range(500):
            if rec.snapshot().errors.get("telemetry.summary"):
                break
            rec.tier("gpu").allocate(1)
            import time

            time.sleep(0.01)
    finally:
        summary.stop()
    assert rec.snapshot().errors["telemetry.summary"] >= 1


def test_summary_event_fields():
    rec = scripted_recorder()
    summary = SummaryLogger(rec, structlog.get_logger("kvobs"), interval_s=60)
    rec.lookup(100, gpu_hit=25, host_hit=50)  # the interval covers only this lookup
    with structlog.testing.capture_logs() as logs:
        summary.log_now()
    event = logs[-1]
    assert event["event"] == "kv_cache_summary"
    assert event["tiers"]["host"]["cached"] == 1
    assert event["lookup_tokens"] == {
        "gpu_hit": 0.25,
        "host_hit": 0.5,
        "disk_hit": 0.0,
        "miss": 0.25,
    }
    assert event["transfers"]["gpu->host"]["drops"] == 3
    assert event["thrash_onloads"] == 1 and event["offloaded_evicted_unused"] == 1
