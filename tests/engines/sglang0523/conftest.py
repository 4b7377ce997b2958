"""Fixtures of the SGLang 0.5.23 suite: the scheduler loop with its CPU stand-ins."""

from __future__ import annotations

import pytest

from tests.engines.sglang0523.scheduler_loop import install_stand_ins
from tests.fleet.publisher_checks import engines  # noqa: F401 (a fixture: test_fleet_events)


@pytest.fixture
def stand_ins(monkeypatch: pytest.MonkeyPatch) -> None:
    """The two CUDA-only calls replaced for one test (see ``scheduler_loop``)."""
    install_stand_ins(monkeypatch)
