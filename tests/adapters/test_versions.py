"""The releases each engine adapter was tested on: one declaration
(``kvobs.adapters.versions``) that the CI matrix builds, the enable line names and the
info series exports; a part that cannot read its engine says so instead of exporting 0."""

from __future__ import annotations

import re

import pytest
from structlog.testing import capture_logs

from kvobs.adapters import gate, versions
from kvobs.adapters._hooks import AdapterSpec, Hook, Instrumentation, instrument
from kvobs.events import NULL_TIER
from kvobs.logs import get_logger
from kvobs.recorder import Recorder
from kvobs.telemetry.series import recorder_series
from tests.required import REPO


def matrix() -> dict[str, set[str]]:
    """``{distribution: {version}}`` of the engine venvs scripts/deps/engines.sh builds."""
    text = (REPO / "scripts/deps/engines.sh").read_text()
    table = text.split("declare -A ENGINE_PKG=(", 1)[1].split(")", 1)[0]
    found: dict[str, set[str]] = {}
    for name, release in re.findall(r'"([A-Za-z0-9_.-]+)==([0-9.]+)"', table):
        found.setdefault(name, set()).add(release)
    return found


def test_the_ci_matrix_builds_exactly_the_releases_declared_tested():
    declared: dict[str, set[str]] = {}
    for engine in versions.ENGINES.values():
        for release in engine.releases:
            declared.setdefault(release.distribution, set()).add(release.version)
    assert matrix() == declared


@pytest.mark.parametrize(("release", "expected"), [
    ("0.33.0", "tested"), ("0.34.0", "tested"), ("0.32.0+cpu", "tested"),
    ("0.34.1", "untested"), ("0.35.0", "untested"), ("1.0.0rc1", "untested"),
    ("0.33.2", "untested"), ("0.31.0", "older"), ("0.9.9", "older")])
def test_a_release_is_tested_untested_or_older(release, expected):
    assert versions.support("vllm", release) == expected


class Pool:
    def get_new_blocks(self, num_blocks):
        return [0] * num_blocks


class OldPool:
    def get_new_blocks(self, count):  # another release's parameter name
        return [0] * count


SPEC = AdapterSpec("vllm.block_pool", ("Pool", "OldPool"), (
    Hook("get_new_blocks", ("num_blocks",), "allocate", count="num_blocks"),))


def start(pool: object, rec: Recorder) -> Instrumentation:
    """``pool`` instrumented as the GPU tier: inactive, its reasons said, where its
    release's signature differs."""
    def make(active: bool) -> Instrumentation:
        tier = rec.add_tier("gpu", 8, 16, 64) if active else None
        return Instrumentation(pool, SPEC.component, active, rec, tier or NULL_TIER)

    with capture_logs():
        return instrument(pool, SPEC, make)


def test_the_enable_line_and_the_info_series_say_each_part_on_or_off_and_why():
    rec = Recorder(engine="vllm")
    good, old = start(Pool(), rec), start(OldPool(), Recorder())
    steps = Instrumentation(object(), "vllm.scheduler_steps", active=True, rec=rec)
    steps.retired.append("update_from_output")
    states = [str(s) for s in gate.part_states([good, old, steps])]
    assert states == [
        "gpu_tier off (OldPool.get_new_blocks(count) does not start with (num_blocks))",
        "step_timing off (a reader failed in update_from_output)"]
    parts = [good, steps]
    rec.add_source(gate.info_source("vllm", lambda: parts))
    series = recorder_series(rec)
    release, support = gate.release("vllm")
    assert series["kvobs_engine_info"] == [({"engine_version": release, "support": support},
                                            1.0)]
    assert series["kvobs_part_enabled"] == [({"part": "gpu_tier"}, 1.0),
                                            ({"part": "step_timing"}, 0.0)]
    parts.append(old)  # read at each collection: a part that went off reads 0
    assert recorder_series(rec)["kvobs_part_enabled"][0] == ({"part": "gpu_tier"}, 0.0)


def test_the_enable_line_names_release_support_tested_and_parts():
    rec = Recorder(engine="vllm")
    with capture_logs() as logs:
        gate.log_instrumented(get_logger("kvobs.vllm"), "vllm", [start(Pool(), rec)], dp_rank="0")
    ((event, fields),) = [(log.pop("event"), log) for log in logs]
    fields.pop("log_level")
    release, support = gate.release("vllm")
    assert event == "kvobs_instrumented"
    assert fields == {"engine": "vllm", "version": release, "support": support,
                      "tested": "0.32.0, 0.33.0, 0.34.0", "parts": "gpu_tier on",
                      "dp_rank": "0"}
