"""Both ends of every declared dependency range: the telemetry suites in ``.venv-floor``.

``scripts/deps/floor.sh`` builds ``.venv-floor`` with each runtime dependency at the lowest
version ``pyproject.toml`` declares; the main venv, built fresh, has the newest. This test
runs the suites that exercise those libraries (``/metrics``, OTLP push and its faults,
the web-config server, the capacity and summary logs) at the floor, and checks that the
venv really is at the floor of what ``pyproject.toml`` declares now.
"""

from __future__ import annotations

import os
import subprocess
import sys

from tests.required import REPO, missing

FLOOR = REPO / ".venv-floor" / "bin" / "python"
SUITES = ("tests/telemetry", "tests/reliability/test_web_config.py",
          "tests/reliability/test_coalescing.py", "tests/reliability/test_otlp_faults.py")


def floor_requirements() -> list[str]:
    script = REPO / "scripts" / "deps" / "floor_requirements.py"
    out = subprocess.run([sys.executable, str(script), str(REPO / "pyproject.toml")],
                         capture_output=True, text=True, check=True).stdout
    return out.split()


def test_floor_venv_holds_the_lowest_declared_versions() -> None:
    if not FLOOR.exists():
        missing(f"{FLOOR} is missing: run `bash scripts/deps/floor.sh`")
    frozen = subprocess.run([str(FLOOR), "-m", "pip", "freeze"], capture_output=True,
                            text=True, check=True).stdout.lower().replace("_", "-")
    installed = dict(line.split("==", 1) for line in frozen.splitlines() if "==" in line)
    for pin in floor_requirements():
        name, version = pin.lower().replace("_", "-").split("==")
        assert name in installed, f"{name} missing from .venv-floor: rerun scripts/deps/floor.sh"
        found = installed[name].split(".")
        wanted = version.split(".")
        assert found[:len(wanted)] == wanted and all(p == "0" for p in found[len(wanted):]), \
            f"{name} is {installed[name]} in .venv-floor, the floor is {version}"


def run_at_the_floor(markers: str) -> None:
    """The suites' tests that match ``markers`` (``-m``) pass in ``.venv-floor``."""
    if not FLOOR.exists():
        missing(f"{FLOOR} is missing: run `bash scripts/deps/floor.sh`")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KVOBS_", "PYTEST_"))}
    proc = subprocess.run(
        [str(FLOOR), "-m", "pytest", *SUITES, "-q", "-p", "no:cacheprovider", "-m", markers],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and " skipped" not in proc.stdout, proc.stdout[-2000:]


def test_telemetry_suites_pass_at_the_floor_of_every_declared_range() -> None:
    run_at_the_floor("not timing")


def test_telemetry_timing_tests_pass_at_the_floor_alone() -> None:
    """The engine's event rate under each OTLP fault: in make test's serial phase."""
    run_at_the_floor("timing")
