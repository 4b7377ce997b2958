"""Push OTLP/HTTP protobuf to a real in-test receiver and decode what arrived."""

import pytest
import structlog

from kvobs.errors import ConfigError
from kvobs.exporter import Telemetry
from kvobs.telemetry.otlp import metrics_url
from tests.telemetry.otlp_receiver import OtlpReceiver
from tests.telemetry.scripted import scripted_recorder


def test_push_arrives_with_exact_values():
    rec = scripted_recorder()
    with OtlpReceiver() as receiver, structlog.testing.capture_logs():
        telemetry = Telemetry.start(
            rec,
            structlog.get_logger("kvobs"),
            metrics_addr=None,
            otlp_endpoint=receiver.endpoint,
            otlp_interval_s=60,
            summary_interval_s=0,
        )
        telemetry.flush()
        assert receiver.received.wait(10)
        points = receiver.latest_points()
        telemetry.close()
    assert receiver.paths[-1] == "/v1/metrics"
    assert receiver.content_types[-1] == "application/x-protobuf"
    outcomes = {a["outcome"]: p.as_int for a, p in points["kvobs_lookup_tokens"]}
    assert outcomes == {"gpu_hit": 64, "host_hit": 32, "disk_hit": 0, "miss": 104}
    assert all(
        a["engine"] == "scripted" and a["model"] == "tiny" for a, _ in points["kvobs_lookup_tokens"]
    )
    resident = {(a["tier"], a["state"]): p.as_int for a, p in points["kvobs_tier_resident_blocks"]}
    assert resident[("gpu", "in_use")] == 7 and resident[("host", "cached")] == 1
    durations = {(a["src_tier"], a["dst_tier"]): p for a, p in points["kvobs_transfer_duration"]}
    onload = durations[("host", "gpu")]
    assert onload.count == 2 and onload.sum == pytest.approx(0.203)
    assert onload.explicit_bounds[0] == pytest.approx(1e-5)
    assert onload.explicit_bounds[-1] == pytest.approx(10.0)
    assert rec.snapshot().errors == {}


def test_unreachable_collector_is_counted_not_raised():
    rec = scripted_recorder()
    with OtlpReceiver() as receiver:
        dead = receiver.endpoint  # nothing listens once the receiver is closed
    with structlog.testing.capture_logs():
        telemetry = Telemetry.start(
            rec,
            structlog.get_logger("kvobs"),
            metrics_addr=None,
            otlp_endpoint=dead,
            otlp_interval_s=60,
            summary_interval_s=0,
        )
        telemetry.flush()
        rec.tier("gpu").allocate(1)  # the engine goes on
        telemetry.close()
    assert rec.snapshot().errors.get("telemetry.otlp", 0) >= 1


def test_env_endpoint_is_used(monkeypatch):
    rec = scripted_recorder()
    with OtlpReceiver() as receiver, structlog.testing.capture_logs():
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
        telemetry = Telemetry.start(
            rec,
            structlog.get_logger("kvobs"),
            metrics_addr=None,
            otlp_interval_s=60,
            summary_interval_s=0,
        )
        telemetry.flush()
        assert receiver.received.wait(10)
        telemetry.close()


@pytest.mark.parametrize(
    ("endpoint", "expected"),
    [
        ("http://h:4318", "http://h:4318/v1/metrics"),
        ("http://h:4318/v1/metrics/", "http://h:4318/v1/metrics"),
    ],
)
def test_metrics_url(endpoint, expected):
    assert metrics_url(endpoint) == expected


def test_bad_endpoint():
    with pytest.raises(ConfigError, match="--otlp-endpoint"):
        metrics_url("localhost:4318")
