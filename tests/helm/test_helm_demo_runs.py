"""The demo container spec runs the real `kvobs demo` and its probes see live metrics.

The chart's args, env and probe paths are taken from the rendered Deployment and run
as a local process (bound to 127.0.0.1 instead of 0.0.0.0), as the kubelet would run
them: wait for readiness, check memory against the limit, stop with SIGTERM. The process
sees only the packages the image installs (runtime_only.py hides dev-only ones).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.helm.helm_render import HelmChart, dockerfile_arg, one

RUNTIME_ONLY = Path(__file__).resolve().parent / "runtime_only.py"
STARTUP_TIMEOUT_S = 90.0
UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def quantity_bytes(quantity: str) -> int:
    for suffix, factor in UNITS.items():
        if quantity.endswith(suffix):
            return int(quantity[: -len(suffix)]) * factor
    return int(quantity)


def peak_rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM in /proc status")


def get(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return str(response.read().decode())
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux /proc")
def test_demo_container_serves_metrics_within_its_limits(chart: HelmChart, tmp_path: Path) -> None:
    port = free_port()
    docs = chart.render("--set", "demo.enabled=true", "--set", f"demo.port={port}")
    (container,) = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    args = [a.replace(f"0.0.0.0:{port}", f"127.0.0.1:{port}") for a in container["args"]]
    assert args != container["args"], "the chart binds the metrics port on all interfaces"
    env = {**os.environ, **{item["name"]: item["value"] for item in container["env"]}}
    env["HOME"] = str(tmp_path)  # the pod's /tmp emptyDir
    env["KVOBS_IMAGE_EXTRAS"] = dockerfile_arg("KVOBS_EXTRAS")
    ready_url = f"http://127.0.0.1:{port}{container['readinessProbe']['httpGet']['path']}"
    live_url = f"http://127.0.0.1:{port}{container['livenessProbe']['httpGet']['path']}"

    log = tmp_path / "demo.log"  # a file, not a pipe: a chatty process never blocks on it
    with log.open("w") as sink:
        process = subprocess.Popen(
            [sys.executable, str(RUNTIME_ONLY), *args], env=env, stdout=sink, stderr=sink
        )
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        body = None
        while body is None or "kvobs_tier_capacity_blocks" not in body:
            if process.poll() is not None:
                pytest.fail(f"kvobs demo exited {process.returncode}:\n{log.read_text()}")
            assert time.monotonic() < deadline, "readiness probe never saw kvobs metrics"
            time.sleep(0.5)
            body = get(ready_url)
        assert get(live_url) is not None
        limit = quantity_bytes(container["resources"]["limits"]["memory"])
        assert peak_rss_bytes(process.pid) < 0.9 * limit, "the demo would be OOM-killed"
    finally:
        process.send_signal(signal.SIGTERM)  # what the kubelet sends on pod deletion
        try:
            returncode = process.wait(timeout=30)  # the default termination grace period
        except subprocess.TimeoutExpired:
            process.kill()
            raise
    assert returncode == 0


def test_runtime_only_hides_exactly_the_dev_packages() -> None:
    from tests.helm import runtime_only

    allowed = runtime_only.runtime_closure("kvobs", set(dockerfile_arg("KVOBS_EXTRAS").split(",")))
    assert {"opentelemetry-sdk", "prometheus-client", "structlog", "torch"} <= allowed
    hidden = runtime_only.hidden_modules(allowed)
    assert {"pytest", "grafanalib"} <= hidden
    # PyYAML and bcrypt are runtime dependencies since --web-config-file reads them.
    assert not {"opentelemetry", "prometheus_client", "structlog", "torch", "yaml",
                "bcrypt"} & hidden
