"""Every setting :meth:`kvobs.telemetry.settings.TelemetrySettings.from_env` reads, from its
variable and from an explicit value, and the fix each variable's error names."""

from __future__ import annotations

import re

import pytest

from kvobs.errors import ConfigError
from kvobs.telemetry.settings import TelemetrySettings, read_env

ENV = {
    "KVOBS_METRICS_ADDR": "0.0.0.0:9500",
    "KVOBS_METRICS_MIN_INTERVAL_S": "0.5",
    "KVOBS_WEB_CONFIG_FILE": " /etc/kvobs/web.yml ",
    "KVOBS_OTLP_ENDPOINT": "https://collector:4318",
    "OTEL_METRIC_EXPORT_INTERVAL": "2500",
    "KVOBS_SUMMARY_INTERVAL_S": "30",
    "KVOBS_LOG_FORMAT": "json",
    "KVOBS_TRACE_OUT": "/tmp/trace.jsonl",
    "KVOBS_TRACE_MAX_BYTES": "1048576",
    "KVOBS_PREFILL_SECONDS_PER_TOKEN": "2.5e-5",
}


def test_every_variable_is_read() -> None:
    assert TelemetrySettings.from_env(ENV) == TelemetrySettings(
        metrics_addr="0.0.0.0:9500", port_attempts=1, metrics_min_interval_s=0.5,
        web_config_file="/etc/kvobs/web.yml", otlp_endpoint="https://collector:4318",
        otlp_interval_s=2.5, summary_interval_s=30.0, log_format="json",
        trace_out="/tmp/trace.jsonl", trace_max_bytes=1 << 20,
        prefill_seconds_per_token=2.5e-5, nvml=True)


def test_nothing_set_is_every_default() -> None:
    assert TelemetrySettings.from_env({}) == TelemetrySettings()
    assert TelemetrySettings() == TelemetrySettings(
        "127.0.0.1:9464", 1, 0.25, None, None, 10.0, 60.0, None, None, 256 << 20, None, True)


def test_explicit_values_win_over_every_variable() -> None:
    explicit = {"metrics_addr": "127.0.0.1:0", "port_attempts": 5,
                "metrics_min_interval_s": 0.0, "web_config_file": "mine.yml",
                "otlp_endpoint": None, "otlp_interval_s": 1.0, "summary_interval_s": 0,
                "log_format": "console", "trace_out": "mine.jsonl", "trace_max_bytes": 10,
                "prefill_seconds_per_token": 1e-4, "nvml": False}
    settings = TelemetrySettings.from_env({**ENV, "OTEL_EXPORTER_OTLP_ENDPOINT": "http://o:1"},
                                          **explicit)
    assert settings == TelemetrySettings(**explicit)


@pytest.mark.parametrize(("variable", "value", "message"), [
    ("KVOBS_METRICS_MIN_INTERVAL_S", "fast",
     "'fast' is not a number: pass seconds, e.g. 0.25 (0: every scrape collects)"),
    ("KVOBS_SUMMARY_INTERVAL_S", "-1",
     "'-1' must be a finite number >= 0: pass seconds, e.g. 60 (0: off)"),
    ("KVOBS_PREFILL_SECONDS_PER_TOKEN", "nan",
     "'nan' must be a finite number >= 0: pass seconds, e.g. 2.5e-5"),
    ("OTEL_METRIC_EXPORT_INTERVAL", "0", "'0' must be > 0: pass milliseconds, e.g. 10000"),
    ("KVOBS_TRACE_MAX_BYTES", "1e6",
     "'1e6' is not a whole number > 0: pass bytes, e.g. 268435456"),
    ("KVOBS_LOG_FORMAT", "xml", "'xml' is not a log format: use auto, json, console"),
    ("KVOBS_OTLP_ENDPOINT", "grpc://c:4317",
     "'grpc://c:4317' is not an http(s) URL: pass e.g. http://127.0.0.1:4318"),
    ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:99999",
     "'http://c:99999' has an invalid port: use 1-65535"),
])
def test_each_variables_error_names_it_the_value_and_the_fix(
        variable: str, value: str, message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        TelemetrySettings.from_env({variable: f" {value} "})
    assert str(raised.value) == (
        f"environment variable {variable}={f' {value} '!r} is invalid: {message}")
    told: list[tuple[object, ...]] = []
    settings = TelemetrySettings.from_env({variable: value},
                                          on_invalid=lambda *args: told.append(args))
    assert settings == TelemetrySettings()
    assert len(told) == 1 and told[0][:3] == (variable, value, message)


def test_an_empty_metrics_address_serves_no_metrics_and_a_bad_one_falls_back_to_none() -> None:
    assert TelemetrySettings.from_env({"KVOBS_METRICS_ADDR": "  "}).metrics_addr is None
    told: list[tuple[object, ...]] = []
    settings = TelemetrySettings.from_env({"KVOBS_METRICS_ADDR": "nowhere"},
                                          on_invalid=lambda *args: told.append(args))
    assert settings.metrics_addr == "127.0.0.1:9464" and told[0][3] == "127.0.0.1:9464"
    with pytest.raises(ConfigError, match=re.escape("'nowhere' is not HOST:PORT")):
        TelemetrySettings.from_env({"KVOBS_METRICS_ADDR": "nowhere"})


def test_read_env_reads_the_process_environment_by_default(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVOBS_TEST_SETTING", " 7 ")
    assert read_env("KVOBS_TEST_SETTING", int, 1) == 7
    monkeypatch.setenv("KVOBS_TEST_SETTING", "\t")
    assert read_env("KVOBS_TEST_SETTING", int, 1) == 1
    monkeypatch.delenv("KVOBS_TEST_SETTING")
    assert read_env("KVOBS_TEST_SETTING", int, 1) == 1
    assert read_env("KVOBS_TEST_SETTING", int, 1, {"KVOBS_TEST_SETTING": "3"}) == 3
