"""``import kvobs``: the documented API, the README example, the docstring examples."""

import doctest
import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

import kvobs

REPO = Path(__file__).resolve().parents[2]
SECTION = "## Instrument your own engine"


def readme_example():
    text = (REPO / "README.md").read_text()
    assert SECTION in text, f"README lost its {SECTION!r} section"
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```pycon\n(.*?)```", section, flags=re.S)
    assert len(blocks) == 1, "the section should hold one ```pycon example"
    return blocks[0]


def run_doctest_in_subprocess(source, name):
    """Run doctest ``source`` in a fresh interpreter (it configures logging process-wide)."""
    code = (
        "import doctest, sys\n"
        "source = sys.stdin.read()\n"
        "test = doctest.DocTestParser().get_doctest(source, {}, NAME, NAME, 0)\n"
        "runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)\n"
        "runner.run(test)\n"
        "sys.exit(1 if runner.failures or not runner.tries else 0)\n"
    ).replace("NAME", repr(name))
    return subprocess.run([sys.executable, "-c", code], input=source, capture_output=True,
                          text=True, timeout=120, cwd=REPO)


def test_readme_instrument_your_own_engine_runs():
    example = readme_example()
    lines = [line for line in example.splitlines() if line.startswith(">>> ")]
    assert len(example.splitlines()) <= 20 and len(lines) >= 6  # "about 15 lines"
    result = run_doctest_in_subprocess(example, "README")
    assert result.returncode == 0, result.stdout + result.stderr


def test_package_docstring_example_runs():
    result = run_doctest_in_subprocess(kvobs.__doc__, "kvobs")
    assert result.returncode == 0, result.stdout + result.stderr


def test_all_names_resolve_and_are_documented():
    for name in kvobs.__all__:
        value = getattr(kvobs, name)
        assert value is not None
        if callable(value):
            assert value.__doc__, f"kvobs.{name} has no docstring"
    assert set(kvobs.__all__) <= set(dir(kvobs))
    with pytest.raises(AttributeError):
        kvobs.nope  # noqa: B018


def test_import_kvobs_is_cheap():
    code = ("import sys, kvobs; heavy = [m for m in ('torch', 'opentelemetry', 'matplotlib', "
            "'grafanalib', 'rich') if m in sys.modules]; print(heavy)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60)
    assert result.stdout.strip() == "[]", result.stdout + result.stderr


def test_start_telemetry_leaves_logging_alone_with_logs_none():
    import structlog

    rec = kvobs.Recorder(engine="e", model="m")
    kvobs.KVCacheCallbacks(rec, {"gpu": (8, 16, 1024)})
    with structlog.testing.capture_logs() as logs:
        telemetry = kvobs.start_telemetry(rec, metrics_addr="127.0.0.1:0", logs=None,
                                          summary_interval_s=0, nvml=False)
    try:
        events = [e["event"] for e in logs]
        assert events[0] == "kv_cache_capacity" and "metrics_serving" in events
        assert telemetry.metrics_url.startswith("http://127.0.0.1:")
    finally:
        telemetry.close()


@pytest.mark.parametrize("name", [
    "kvobs.top.scrape", "kvobs.top.model", "kvobs.top.render", "kvobs.report.palette",
    "kvobs.report.boards", "kvobs.report.render", "kvobs.cli.options",
])
def test_docstring_examples_run(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted > 0
