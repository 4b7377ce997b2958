"""One settings object: every bad variable is one line naming it (CLI, start_telemetry);
inside an engine it is ignored with one warning and kvobs still starts."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import urllib.request

import pytest
import structlog

import kvobs
from kvobs.adapters import _plugin
from kvobs.errors import ConfigError
from kvobs.recorder import Recorder
from kvobs.telemetry.settings import TelemetrySettings

BAD = [
    ("KVOBS_METRICS_ADDR", "localhost", "is not HOST:PORT"),
    ("KVOBS_METRICS_MIN_INTERVAL_S", "-1", "must be a finite number >= 0"),
    ("KVOBS_OTLP_ENDPOINT", "collector:4318", "is not an http(s) URL"),
    ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://x:99999", "has an invalid port"),
    ("OTEL_METRIC_EXPORT_INTERVAL", "0", "must be > 0"),
    ("KVOBS_SUMMARY_INTERVAL_S", "6O", "is not a number"),
    ("KVOBS_LOG_FORMAT", "xml", "is not a log format"),
    ("KVOBS_TRACE_MAX_BYTES", "1GB", "is not a whole number > 0"),
    ("KVOBS_PREFILL_SECONDS_PER_TOKEN", "25us", "is not a number"),
]


@pytest.mark.parametrize(("variable", "value", "reason"), BAD, ids=[b[0] for b in BAD])
def test_strict_a_bad_variable_is_one_line_naming_it(variable: str, value: str,
                                                      reason: str) -> None:
    with pytest.raises(ConfigError) as error:
        TelemetrySettings.from_env({variable: value})
    message = str(error.value)
    assert message.startswith(f"environment variable {variable}={value!r} is invalid: ")
    assert reason in message and "\n" not in message


@pytest.mark.parametrize(("variable", "value", "reason"), BAD, ids=[b[0] for b in BAD])
def test_embedded_a_bad_variable_is_ignored_and_said(variable: str, value: str,
                                                     reason: str) -> None:
    said: list[tuple[str, str, str, object]] = []
    settings = TelemetrySettings.from_env({variable: value},
                                          on_invalid=lambda *a: said.append(a))
    assert settings == TelemetrySettings()  # every default, nothing else changed
    assert len(said) == 1 and said[0][:2] == (variable, value) and reason in said[0][2]


def test_precedence_explicit_then_kvobs_then_otel_then_default() -> None:
    env = {"KVOBS_OTLP_ENDPOINT": "http://kvobs:4318", "OTEL_EXPORTER_OTLP_ENDPOINT":
           "http://otel:4318", "OTEL_METRIC_EXPORT_INTERVAL": "2500",
           "KVOBS_METRICS_ADDR": ""}
    settings = TelemetrySettings.from_env(env)
    assert settings.otlp_endpoint == "http://kvobs:4318"
    assert settings.otlp_interval_s == 2.5
    assert settings.metrics_addr is None  # set empty: no endpoint
    del env["KVOBS_OTLP_ENDPOINT"]
    assert TelemetrySettings.from_env(env).otlp_endpoint == "http://otel:4318"
    explicit = TelemetrySettings.from_env(env, otlp_endpoint=None, metrics_addr="[::1]:0")
    assert explicit.otlp_endpoint is None and explicit.metrics_addr == "[::1]:0"
    assert TelemetrySettings.from_env({}).summary_interval_s == 60.0
    with pytest.raises(TypeError, match="metrics_adr"):
        TelemetrySettings.from_env({}, metrics_adr="x")


def test_start_telemetry_names_a_bad_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVOBS_SUMMARY_INTERVAL_S", "6O")
    with pytest.raises(ConfigError, match="KVOBS_SUMMARY_INTERVAL_S='6O'"):
        kvobs.start_telemetry(Recorder(), metrics_addr="127.0.0.1:0", nvml=False)


def test_a_configured_prefill_cost_reaches_the_recorder_at_telemetry_start(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The recorder (core) reads no environment: the variable is a telemetry setting, and
    # the one start path hands it to the recorder's PrefillCost, unless it has a cost.
    monkeypatch.setenv("KVOBS_PREFILL_SECONDS_PER_TOKEN", "2.5e-5")
    unknown, modelled = Recorder(), Recorder()
    assert unknown.prefill_cost.source == "none"  # nothing read at construction
    modelled.prefill_cost.set(1e-5, "modelled")
    for rec in (unknown, modelled):
        kvobs.start_telemetry(rec, metrics_addr=None, summary_interval_s=0, nvml=False).close()
    assert (unknown.prefill_cost.source, unknown.prefill_cost.seconds_per_token) == \
        ("configured", 2.5e-5)
    assert (modelled.prefill_cost.source, modelled.prefill_cost.seconds_per_token) == \
        ("modelled", 1e-5)


def test_plugin_a_typo_never_disables_kvobs(monkeypatch: pytest.MonkeyPatch) -> None:
    # The bug this pins: float() of a typo raised in vLLM's plugin hook and left the
    # whole engine uninstrumented; KVOBS_TRACE_MAX_BYTES fell back without a word.
    monkeypatch.setenv("KVOBS_SUMMARY_INTERVAL_S", "6O")
    monkeypatch.setenv("KVOBS_TRACE_MAX_BYTES", "1GB")
    monkeypatch.setenv("KVOBS_METRICS_ADDR", "127.0.0.1:0")
    rec = Recorder(engine="vllm", model="m")
    rec.add_tier("gpu", capacity_blocks=8, block_tokens=16, block_bytes=64).allocate(2)
    with structlog.testing.capture_logs() as logs:
        log = structlog.get_logger("kvobs.test")
        telemetry = _plugin.start_telemetry(rec, log, port_offset=0)
    try:
        ignored = {e["variable"]: e for e in logs if e["event"] == "kvobs_setting_ignored"}
        assert set(ignored) == {"KVOBS_SUMMARY_INTERVAL_S", "KVOBS_TRACE_MAX_BYTES"}
        assert ignored["KVOBS_SUMMARY_INTERVAL_S"]["using"] == 60.0
        assert ignored["KVOBS_TRACE_MAX_BYTES"]["using"] == 256 << 20
        assert ignored["KVOBS_SUMMARY_INTERVAL_S"]["log_level"] == "warning"
        assert any(e["event"] == "kvobs_enabled" for e in logs)
        assert telemetry.summary is not None  # the default interval runs
        assert telemetry.metrics_url is not None
        with urllib.request.urlopen(telemetry.metrics_url, timeout=10) as response:
            assert b'kvobs_block_allocations_total{engine="vllm",model="m",tier="gpu"} 2.0' \
                in response.read()
    finally:
        telemetry.close()


EMBEDDED = textwrap.dedent("""
    import logging, sys
    import structlog
    # What vLLM does at import: its own namespace configured, not the root.
    host = logging.getLogger("vllm")
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("HOST %(levelname)s [%(name)s] %(message)s"))
    host.addHandler(handler)
    host.setLevel(logging.INFO)
    host.propagate = False
    from kvobs.adapters import _plugin
    from kvobs.recorder import Recorder
    from kvobs.logs import get_logger
    rec = Recorder(engine="vllm", model="m", labels={"dp_rank": "0"})
    rec.add_tier("gpu", capacity_blocks=8, block_tokens=16, block_bytes=64)
    telemetry = _plugin.start_telemetry(rec, get_logger("kvobs.vllm"), 0,
                                        request_tokens=64, host_logger="vllm")
    telemetry.close()
    print("STRUCTLOG_CONFIGURED", structlog.is_configured())
""")


@pytest.mark.parametrize("fmt", ["", "json"])
def test_embedded_events_go_through_the_hosts_logging(fmt: str) -> None:
    env = {"KVOBS_METRICS_ADDR": "127.0.0.1:0", "KVOBS_SUMMARY_INTERVAL_S": "nope",
           "KVOBS_LOG_FORMAT": fmt, "PATH": "/usr/bin:/bin"}
    result = subprocess.run([sys.executable, "-c", EMBEDDED], capture_output=True,
                            text=True, timeout=60, env=env)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[-1] == "STRUCTLOG_CONFIGURED False"  # kvobs configured nothing
    ours = [line for line in lines if line.startswith("HOST ")]
    assert ours, result.stdout + result.stderr
    assert all(" [kvobs.vllm] " in line for line in ours)  # under kvobs, vLLM's format
    messages = [line.split("] ", 1)[1] for line in ours]
    if fmt == "json":
        events = [json.loads(m) for m in messages]
        names = [e["event"] for e in events]
        ignored = events[names.index("kvobs_setting_ignored")]
        assert ignored["variable"] == "KVOBS_SUMMARY_INTERVAL_S" and ignored["using"] == 60.0
    else:
        names = [m.split(" ", 1)[0] for m in messages]
        warning = next(line for line in ours if "kvobs_setting_ignored" in line)
        assert warning.startswith("HOST WARNING ")
        assert "variable=KVOBS_SUMMARY_INTERVAL_S value=nope" in warning
    assert {"kvobs_setting_ignored", "kv_cache_capacity", "metrics_serving",
            "kvobs_enabled"} <= set(names)
    assert result.stderr == ""  # nothing printed past the host's logging
