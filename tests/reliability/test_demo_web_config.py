"""``kvobs demo --web-config-file`` (and ``KVOBS_WEB_CONFIG_FILE``) end to end.

A real demo process serves /metrics over TLS with basic auth from a web config file
whose certificates the test makes with ``openssl``; bad files fail before torch loads,
in one line naming the field.
"""

from __future__ import annotations

import base64
import http.client
import os
import ssl
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.e2e.e2e_servers import Server, free_port, poll
from tests.reliability.certs import Pki, make_ca
from tests.required import missing

try:
    from kvobs.telemetry.webconfig import hash_password
except ImportError:  # pragma: no cover - the module is part of kvobs
    missing("kvobs.telemetry.webconfig is missing")

PASSWORD = "s3cret scrape"
CLI = [sys.executable, "-c", "import sys; from kvobs.cli import main; sys.exit(main())"]


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_ca(tmp_path_factory.mktemp("pki"))


def web_config(directory: Path, pki: Pki) -> Path:
    cert, key = pki.leaf("demo", server=True)
    path = directory / "web.yml"
    path.write_text(
        f"tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n"
        f"basic_auth_users:\n  prometheus: '{hash_password(PASSWORD, rounds=4)}'\n")
    return path


def fetch(port: int, context: ssl.SSLContext | None, auth: str | None) -> tuple[int, bytes]:
    conn: http.client.HTTPConnection
    if context is None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    else:
        conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=10, context=context)
    headers = {"Authorization": "Basic " + base64.b64encode(auth.encode()).decode()} \
        if auth else {}
    try:
        conn.request("GET", "/metrics", headers=headers)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def start(workdir: Path, port: int, *args: str, env: dict[str, str] | None = None) -> Server:
    log = workdir / "demo.log"
    with log.open("wb") as handle:
        process = subprocess.Popen(
            [*CLI, "demo", "--duration", "60", "--metrics-addr", f"127.0.0.1:{port}",
             "--gpu-blocks", "256", "--host-blocks", "512", "--log-format", "json",
             "--summary-interval", "0", *args],
            stdout=handle, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})})
    return Server(process, f"https://127.0.0.1:{port}", log)


@pytest.mark.parametrize("how", ["flag", "env"])
def test_demo_serves_tls_with_basic_auth(tmp_path: Path, pki: Pki, how: str) -> None:
    config = web_config(tmp_path, pki)
    port = free_port()
    if how == "flag":
        demo = start(tmp_path, port, "--web-config-file", str(config))
    else:
        demo = start(tmp_path, port, env={"KVOBS_WEB_CONFIG_FILE": str(config)})
    context = ssl.create_default_context(cafile=str(pki.ca_cert))
    try:
        def ready() -> bool | None:
            if demo.process.poll() is not None:
                raise AssertionError(demo.log.read_text()[-3000:])
            try:
                return True if fetch(port, context, f"prometheus:{PASSWORD}")[0] == 200 \
                    else None
            except OSError:
                return None

        poll("the demo's TLS endpoint", ready, 90, demo.log)
        status, body = fetch(port, context, f"prometheus:{PASSWORD}")
        assert status == 200 and b"kvobs_lookups_total{" in body
        assert fetch(port, context, "prometheus:wrong")[0] == 401
        assert fetch(port, context, None)[0] == 401
        status, body = fetch(port, None, f"prometheus:{PASSWORD}")  # plain HTTP to TLS
        assert status == 400 and b"kvobs_" not in body
        assert "metrics_serving" in demo.log.read_text()
        assert f"https://127.0.0.1:{port}/metrics" in demo.log.read_text()
    finally:
        demo.stop()


def test_bad_web_config_is_one_line_before_torch(tmp_path: Path) -> None:
    bad = tmp_path / "web.yml"
    bad.write_text("basic_auth_users:\n  prometheus: hunter2\n")
    start_time = time.monotonic()
    result = subprocess.run([*CLI, "demo", "--duration", "1", "--web-config-file", str(bad),
                             "--metrics-addr", f"127.0.0.1:{free_port()}"],
                            capture_output=True, text=True, timeout=60,
                            env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert result.returncode == 2, result.stderr
    assert "basic_auth_users.prometheus must be a bcrypt hash" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    assert time.monotonic() - start_time < 30  # torch never loaded (~6 s here if it were)
    missing_file = subprocess.run([*CLI, "demo", "--web-config-file", str(tmp_path / "no.yml")],
                                  capture_output=True, text=True, timeout=60)
    assert missing_file.returncode == 2 and "--web-config-file" in missing_file.stderr


def test_the_terminal_view_is_refused_behind_a_web_config(tmp_path: Path, pki: Pki) -> None:
    # kvobs top reads plain HTTP: asking for it behind TLS / basic auth is a clear error.
    result = subprocess.run([*CLI, "demo", "--duration", "1", "--view", "top",
                             "--web-config-file", str(web_config(tmp_path, pki)),
                             "--metrics-addr", f"127.0.0.1:{free_port()}"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "--view top cannot read a /metrics behind --web-config-file" in result.stderr
