"""The catalog follows Prometheus naming, bounded labels, and the README shows it as is."""

import doctest
import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kvobs.catalog import COMMON_LABELS, METRICS
from tests.required import need_torch

ROOT = Path(__file__).resolve().parents[2]
ALLOWED_LABELS = {
    "tier",
    "state",
    "reason",
    "outcome",
    "cause",  # why a token missed: five values (kvobs.snapshot.MISS_CAUSES)
    "src_tier",
    "dst_tier",
    "component",
    "device",
    "source",  # the prefill cost's source: four values
    "le",  # reuse-distance bounds: 15 values, fixed by the configured capacity
    "engine_version",  # the engine release this process runs: one value
    "support",  # tested, untested, older
    "part",  # the parts of an engine kvobs reads (kvobs.adapters.gate.PARTS)
}


@pytest.mark.parametrize("spec", METRICS, ids=lambda spec: spec.name)
def test_names_units_and_labels(spec):
    assert re.fullmatch(r"kvobs_[a-z0-9_]+", spec.name)
    assert spec.name.endswith("_total") == (spec.kind == "counter")
    if spec.unit == "By":
        assert "_bytes" in spec.name
    if spec.unit == "s":
        assert spec.name.removesuffix("_total").endswith("_seconds")
    assert set(spec.labels) <= ALLOWED_LABELS
    assert not set(spec.labels) & set(COMMON_LABELS)
    assert spec.help.endswith(".") and len(spec.help) > 10
    assert not re.search(r"_(gb|mb|kb|ms|us|per_s)(_|$)", spec.name)  # base units only


def test_names_are_unique():
    names = [spec.name for spec in METRICS]
    assert len(names) == len(set(names))


def test_readme_metrics_table_is_generated_from_the_catalog():
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts/update_readme.py"), "--check"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr


CORE_MODULES = [
    "kvobs.layout",
    "kvobs.presets",
    "kvobs.capacity",
    "kvobs.catalog",
    "kvobs.thrash",
    "kvobs.recorder",
    "kvobs.telemetry.nvml",
    "kvobs.pool.workload",
    "kvobs.events",
    "kvobs.testing",
    "kvobs.adapters._hooks",
    "kvobs.adapters.generic",
    "kvobs.exporter",
    "kvobs.pool.hashing",
    "kvobs.pool.tiered",
    "kvobs.pool.serving",
    "kvobs.telemetry.series",
    "kvobs.telemetry.otel",
    "kvobs.telemetry.logs",
    "kvobs.logs",
    "kvobs.ratelimit",
    "kvobs.telemetry.summary",
    "kvobs.telemetry.prometheus",
    "kvobs.cli.options",
    "kvobs.tiers",
]


@pytest.mark.parametrize("name", CORE_MODULES)
def test_docstring_examples_run(name):
    if name.startswith("kvobs.pool.") or name == "kvobs.testing":
        need_torch()  # the reference pool (kvobs.testing's examples run it)
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
