"""Recorder.error: every failure is counted; each component's is logged with the component,
the exception and the count so far, at most once a minute per component; a log sink that
raises never reaches the caller."""

from __future__ import annotations

from typing import Any

import pytest
import structlog

import kvobs.recorder as recorder_module
from kvobs.ratelimit import RateLimit
from kvobs.recorder import Recorder


def test_an_error_is_logged_with_its_component_exception_and_count() -> None:
    rec = Recorder()
    with structlog.testing.capture_logs() as logs:
        rec.error("adapter.store", ValueError("boom"))
    assert logs == [{"event": "instrumentation_error", "log_level": "warning",
                     "component": "adapter.store", "error": "ValueError('boom')", "count": 1}]
    assert rec.snapshot().errors == {"adapter.store": 1}


def test_each_component_gets_its_own_log_line() -> None:
    rec = Recorder()
    with structlog.testing.capture_logs() as logs:
        rec.error("adapter.store")
        rec.error("adapter.load")
        rec.error("adapter.store")
    assert [(e["component"], e["error"]) for e in logs] == [
        ("adapter.store", "None"), ("adapter.load", "None")
    ]
    assert rec.snapshot().errors == {"adapter.store": 2, "adapter.load": 1}


def test_a_component_is_logged_again_after_a_minute_with_its_count(
        monkeypatch: pytest.MonkeyPatch) -> None:
    now = [0.0]
    monkeypatch.setattr(recorder_module, "RateLimit",
                        lambda interval_s: RateLimit(interval_s, clock=lambda: now[0]))
    rec = Recorder()
    with structlog.testing.capture_logs() as logs:
        rec.error("adapter.store")
        now[0] = 59.9
        rec.error("adapter.store")
        now[0] = 60.0
        rec.error("adapter.store")
    assert [e["count"] for e in logs] == [1, 3]


class _BrokenLog:
    def warning(self, event: str, **fields: Any) -> None:
        raise OSError("log sink gone")


def test_a_broken_log_sink_never_reaches_the_caller(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(recorder_module, "_log", _BrokenLog())
    rec = Recorder()
    rec.error("adapter.store", RuntimeError("x"))
    assert rec.snapshot().errors == {"adapter.store": 1}
