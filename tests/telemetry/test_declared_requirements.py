"""A telemetry package outside the range kvobs declares stops start-up with one line."""

from __future__ import annotations

import pytest
import structlog

from kvobs.errors import ConfigError
from kvobs.exporter import Telemetry
from kvobs.recorder import Recorder
from kvobs.telemetry import requirements
from kvobs.telemetry.requirements import TELEMETRY_PACKAGES, check_declared, declared_ranges


def test_the_ranges_are_kvobs_own_declared_ones() -> None:
    ranges = declared_ranges()
    assert set(ranges) == set(TELEMETRY_PACKAGES)
    assert all(spec.startswith(">=") for spec in ranges.values())
    check_declared()  # this venv is inside them


@pytest.mark.parametrize(("installed", "message"), [
    ({"opentelemetry-sdk": "1.20.0"},
     "kvobs needs opentelemetry-sdk>=1.35 for telemetry, found 1.20.0: "
     "pip install 'opentelemetry-sdk>=1.35'"),
    ({"opentelemetry-sdk": None},
     "kvobs needs opentelemetry-sdk>=1.35 for telemetry, and it is not installed: "
     "pip install 'opentelemetry-sdk>=1.35'"),
])
def test_a_package_outside_its_range_is_named_with_the_fix(
        installed: dict[str, str | None], message: str) -> None:
    with pytest.raises(ConfigError) as error:
        check_declared({"opentelemetry-sdk": ">=1.35"}, installed)
    assert str(error.value) == message


def test_pre_releases_inside_the_range_pass() -> None:
    check_declared({"prometheus-client": ">=0.20"}, {"prometheus-client": "0.21.0rc1"})


def test_telemetry_start_refuses_before_serving_anything(
        monkeypatch: pytest.MonkeyPatch) -> None:
    real = requirements.installed_versions
    monkeypatch.setattr(requirements, "installed_versions",
                        lambda names: {**real(names), "prometheus-client": "0.19.0"})
    with pytest.raises(ConfigError, match=r"prometheus-client>=0\.20 .* found 0\.19\.0"):
        Telemetry.start(Recorder(), structlog.get_logger("kvobs"), metrics_addr="127.0.0.1:0",
                        summary_interval_s=0)
