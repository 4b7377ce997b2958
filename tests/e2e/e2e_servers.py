"""Real servers for the end-to-end tests: ``kvobs demo`` and a Prometheus scraping it.

Both bind 127.0.0.1 on free ports, write their logs into the test's temporary directory
(shown when a start fails) and are stopped by the fixtures that start them. Readiness
is polled, never slept on.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import yaml

T = TypeVar("T")

REPO = Path(__file__).resolve().parents[2]
RULE_FILES = sorted((REPO / "dashboards" / "rules").glob("*.rules.yaml"))

# Tiers sized so that requests flow (the admission queue stays short) while GPU hits,
# host hits with onloads, offloads, host evictions and thrash all happen within seconds.
DEMO_ARGS = ("--gpu-blocks", "512", "--host-blocks", "2048", "--rate", "1",
             "--summary-interval", "0", "--seed", "7")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def poll(what: str, probe: Callable[[], T | None], timeout_s: float, log: Path | None = None,
         interval_s: float = 0.25) -> T:
    """Call ``probe`` until it returns something other than None; fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = probe()
        if result is not None:
            return result
        if time.monotonic() > deadline:
            tail = log.read_text()[-3000:] if log and log.exists() else ""
            raise AssertionError(f"timed out after {timeout_s:g}s waiting for {what}\n{tail}")
        time.sleep(interval_s)


def http_ok(url: str) -> bool | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return True if response.status == 200 else None
    except (urllib.error.URLError, OSError):
        return None


@dataclass
class Server:
    """A started process, where it listens and its log."""

    process: subprocess.Popen[bytes]
    url: str
    log: Path

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)


def _spawn(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as handle:
        return subprocess.Popen(args, stdout=handle, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)


def start_demo(workdir: Path, duration_s: float, *extra: str) -> Server:
    """``kvobs demo`` serving /metrics on a free loopback port."""
    port = free_port()
    log = workdir / "demo.log"
    args = [sys.executable, "-c", "import sys; from kvobs.cli import main; sys.exit(main())",
            "demo", "--duration", str(duration_s), "--metrics-addr", f"127.0.0.1:{port}",
            "--log-format", "json", *extra]
    server = Server(_spawn(args, log), f"http://127.0.0.1:{port}", log)
    try:
        poll("kvobs demo /metrics", lambda: http_ok(server.url + "/metrics")
             if server.process.poll() is None else _died(server), 60, log)
    except BaseException:
        server.stop()
        raise
    return server


def start_prometheus(binary: Path, workdir: Path, targets: list[str],
                     rule_files: list[Path]) -> Server:
    """Prometheus scraping ``targets`` (host:port) every second with ``rule_files`` loaded."""
    port = free_port()
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(path) for path in rule_files],
        "scrape_configs": [{"job_name": "kvobs", "static_configs": [{"targets": targets}]}]
        if targets else [],
    }
    config_path = workdir / "prometheus.yml"
    config_path.write_text(yaml.safe_dump(config))
    log = workdir / "prometheus.log"
    args = [str(binary), f"--config.file={config_path}",
            f"--storage.tsdb.path={workdir / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"]
    server = Server(_spawn(args, log), f"http://127.0.0.1:{port}", log)
    try:
        poll("Prometheus /-/ready", lambda: http_ok(server.url + "/-/ready")
             if server.process.poll() is None else _died(server), 30, log)
    except BaseException:
        server.stop()
        raise
    return server


def _died(server: Server) -> None:
    raise AssertionError(f"{server.process.args!r} exited with {server.process.returncode}:\n"
                         f"{server.log.read_text()[-3000:]}")
