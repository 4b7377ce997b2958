"""The tests are packages (``tests/__init__.py`` and one per directory), collected with
``--import-mode=importlib`` (pyproject.toml): a helper is imported by its full name, e.g.
``from tests.required import missing`` or ``from tests.telemetry.scripted import
scripted_recorder``, from any directory and any engine venv, without ``sys.path`` edits.

The markers (registered in pyproject.toml) come from one table, :data:`MARKS`, by node id:
a directory, a file or one test. ``make test-fast`` leaves out ``engine``, ``slow``,
``terminal``, ``gpu`` and ``timing``; ``make test`` runs everything, the ``timing`` and
``terminal`` tests on their own after the rest. A test module that cannot import torch is
skipped, saying so (an error under ``CI``, where torch is always installed).
"""

from __future__ import annotations

import importlib.util
import os
import re
from collections.abc import Generator
from pathlib import Path

import pytest

from tests.required import NO_TORCH

#: Node id (a directory ending in ``/``, a file, or a file's test) -> its markers.
#: ``slow``: over ~2 s a test (or a module's shared fixture) on a quiet 2-core machine, 5-10 s
#: on a busy one (``--durations=0``). ``timing``: asserts on wall-clock time or throughput,
#: so it runs alone.
MARKS: dict[str, tuple[str, ...]] = {
    # each engine suite runs in its own venv (tests/adapters/test_engine_suites.py)
    "tests/engines/": ("engine",),
    "tests/adapters/test_engine_suites.py": ("engine", "slow"),
    # fits step times from busy-waited steps: reads low where other work shares the cores
    "tests/engines/vllm/test_vllm_real_loop.py::test_step_times_give_the_measured_prefill_cost":
        ("timing",),
    # onload wall time against a configured prefill cost: a loaded machine stretches it
    "tests/engines/vllm032/test_vllm_net_benefit.py::"
    "test_net_benefit_is_vllms_saving_minus_its_onload_time": ("timing",),
    "tests/adapters/test_engine_suites.py::test_engine_suite_timing_tests_pass_alone":
        ("timing",),
    "tests/kernels/test_cuda_device.py": ("gpu",),
    # make test runs these alone too: a worker's tmp_path (.../popen-gw1/...) wraps the
    # demo's last line, which names its log file, at the pane's 100 columns
    "tests/cli/test_top_terminal.py": ("terminal", "slow"),
    # a real Prometheus, demos, fresh venvs (the wheel, the dependency floors), CPython 3.13
    "tests/e2e/test_e2e_host_pool_verdict.py": ("slow",),
    "tests/e2e/test_e2e_stack.py": ("slow",),
    "tests/engines/vllm032/test_vllm_serve.py": ("slow",),  # vllm serve + Prometheus, ~2 min
    "tests/engines/vllm032/test_fleet_serve.py": ("slow",),  # two vllm serve pairs, ~2 min
    "tests/packaging/test_wheel_smoke.py": ("slow",),
    "tests/packaging/test_declared_floor.py": ("slow",),
    "tests/whatif/test_whatif_prometheus.py": ("slow",),
    "tests/kernels/test_python313.py": ("slow",),
    "tests/telemetry/test_otlp_push.py::test_unreachable_collector_is_counted_not_raised":
        ("slow",),
    "tests/reliability/test_load.py": ("slow",),
    # each starts `kvobs demo` (torch's import alone is ~2 s) or several CLI processes
    "tests/reliability/test_demo_web_config.py": ("slow",),
    "tests/cli/test_cli.py::test_demo_serves_host_hits_onloads_and_offloads": ("slow",),
    "tests/whatif/test_whatif_cli.py::test_demo_trace_out_feeds_whatif": ("slow",),
    "tests/helm/test_helm_demo_runs.py": ("slow",),
    "tests/cli/test_no_silent_nonsense.py::test_kvobs_timeout_means_the_same_in_top_and_report":
        ("slow",),
    "tests/cli/test_no_silent_nonsense.py::test_kvobs_model_is_the_preset_not_the_report_filter":
        ("slow",),
    "tests/core/test_reuse.py::test_an_aged_profile_is_exact_up_to_its_exact_keys_for_every_salt":
        ("slow",),
    "tests/cli/test_no_silent_nonsense.py::test_report_png_follows_the_umask": ("slow",),
    "tests/whatif/test_profile_sees_writes.py": ("slow",),  # the reference pool, served
    "tests/reliability/test_soak.py": ("slow",),
    # the engine's event rate under each OTLP fault against its healthy rate, 1 s each
    "tests/reliability/test_otlp_faults.py::test_every_fault_is_counted_and_export_resumes":
        ("slow", "timing"),
    "tests/packaging/test_declared_floor.py::test_telemetry_timing_tests_pass_at_the_floor_alone":
        ("timing",),
    # the engine's event rate with and without scrapers: a share of the cores
    "tests/reliability/test_load.py::test_engine_at_full_rate_loses_little_to_sixteen_scrapers":
        ("timing",),
    "tests/reliability/test_load.py::test_eight_engines_render_within_5x_of_a_direct_render":
        ("timing",),
}

ROOT = Path(__file__).resolve().parents[1]


def _covers(key: str, nodeid: str) -> bool:
    if key.endswith("/"):
        return nodeid.startswith(key)
    return nodeid == key or nodeid.startswith((f"{key}::", f"{key}["))


def pytest_configure(config: pytest.Config) -> None:
    """A key of :data:`MARKS` that names nothing any more is an error, not a lost marker."""
    stale = []
    for key in MARKS:
        path, _, name = key.partition("::")
        where = ROOT / path
        defined = rf"^(async )?def {re.escape(name)}\(|^class {re.escape(name)}\b"
        if not where.exists() or (name and not re.search(defined, where.read_text(), re.M)):
            stale.append(key)
    if stale:
        raise pytest.UsageError(f"tests/conftest.py MARKS names no test: {', '.join(stale)}")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Marks from :data:`MARKS`; the engine tests (minutes each) go first, so that pytest's
    workers (``-n``) start them soonest and spread them (make test's ``--dist load
    --maxschedchunk 1`` hands out one test at a time, in this order)."""
    for item in items:
        for key, marks in MARKS.items():
            if _covers(key, item.nodeid):
                for mark in marks:
                    item.add_marker(mark)
    items.sort(key=lambda item: item.get_closest_marker("engine") is None)


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(
        collector: pytest.Collector) -> Generator[None, pytest.CollectReport, pytest.CollectReport]:
    """A module whose import stops at a missing torch: skipped with that reason."""
    report: pytest.CollectReport = yield
    if (report.failed and isinstance(collector, pytest.Module) and not os.environ.get("CI")
            and "No module named 'torch'" in str(report.longrepr)
            and importlib.util.find_spec("torch") is None):
        return pytest.CollectReport(report.nodeid, "skipped",
                                    (str(collector.path), 1, f"Skipped: {NO_TORCH}"), [],
                                    sections=report.sections)
    return report
