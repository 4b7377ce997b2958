"""/metrics behind an exporter-toolkit web config: TLS, client certificates, basic auth.

Real servers on port 0, real TLS clients (``ssl`` + ``http.client``), certificates made
in the test with ``openssl``.
"""

from __future__ import annotations

import base64
import http.client
import os
import socket
import ssl
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvobs.errors import ConfigError
from kvobs.recorder import Recorder
from kvobs.telemetry.auth import hash_password
from kvobs.telemetry.prometheus import MetricsServer, start_metrics_server
from kvobs.telemetry.webconfig import load_web_config
from tests.reliability.certs import Pki, make_ca
from tests.required import missing

try:
    import bcrypt
except ImportError:  # a kvobs dependency: CI always has it
    missing("bcrypt is not installed: pip install -e '.[dev]'")

PASSWORD = "correct horse"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_ca(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def server_pair(pki: Pki) -> tuple[Path, Path]:
    return pki.leaf("server", server=True)


@pytest.fixture(scope="module")
def user_hash() -> str:
    # exporter-toolkit files hold $2y$ hashes (htpasswd); cost 4 keeps the test fast.
    return "$2y$" + hash_password(PASSWORD, rounds=4)[4:]


def write_config(directory: Path, text: str) -> Path:
    path = directory / "web.yml"
    path.write_text(text)
    return path


def serve(config: Path) -> tuple[MetricsServer, Recorder]:
    recorder = Recorder(engine="secure", model="m")
    recorder.add_tier("gpu", capacity_blocks=8, block_tokens=16, block_bytes=1024).allocate(3)
    server = start_metrics_server("127.0.0.1:0", config)
    server.attach(recorder)
    return server, recorder


@pytest.fixture
def running() -> Iterator[list[MetricsServer]]:
    started: list[MetricsServer] = []
    yield started
    for server in started:
        server.close()


def client_context(pki: Pki, cert: tuple[Path, Path] | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki.ca_cert))
    if cert is not None:
        context.load_cert_chain(*cert)
    return context


def get(server: MetricsServer, context: ssl.SSLContext | None,
        auth: tuple[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    conn: http.client.HTTPConnection
    if context is None:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    else:
        conn = http.client.HTTPSConnection("127.0.0.1", server.port, timeout=10, context=context)
    headers = {}
    if auth is not None:
        headers["Authorization"] = "Basic " + base64.b64encode(":".join(auth).encode()).decode()
    try:
        conn.request("GET", "/metrics", headers=headers)
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        conn.close()


def test_tls_and_basic_auth(tmp_path: Path, pki: Pki, server_pair: tuple[Path, Path],
                            user_hash: str, running: list) -> None:
    cert, key = server_pair
    config = write_config(tmp_path, f"""
tls_server_config:
  cert_file: {cert}
  key_file: {key}
http_server_config:
  headers:
    X-Frame-Options: deny
basic_auth_users:
  prometheus: {user_hash}
""")
    server, _ = serve(config)
    running.append(server)
    assert server.url == f"https://127.0.0.1:{server.port}/metrics"
    context = client_context(pki)
    status, headers, body = get(server, context, ("prometheus", PASSWORD))
    assert status == 200 and b'kvobs_tier_resident_blocks{engine="secure"' in body
    assert headers["X-Frame-Options"] == "deny"
    for auth in (None, ("prometheus", "wrong"), ("nobody", PASSWORD), ("prometheus", "")):
        status, headers, body = get(server, context, auth)
        assert status == 401, auth
        assert headers["WWW-Authenticate"].startswith("Basic")
        assert b"kvobs_" not in body


def test_plain_http_to_the_tls_port_is_refused(tmp_path: Path, server_pair: tuple[Path, Path],
                                               running: list) -> None:
    cert, key = server_pair
    server, _ = serve(write_config(
        tmp_path, f"tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n"))
    running.append(server)
    status, _, body = get(server, None)
    assert status == 400 and b"HTTPS" in body and b"kvobs_" not in body


def test_client_certificates_are_verified(tmp_path: Path, pki: Pki,
                                          server_pair: tuple[Path, Path], running: list) -> None:
    cert, key = server_pair
    clients = make_ca(tmp_path / "clients", "client-ca")
    strangers = make_ca(tmp_path / "strangers", "stranger-ca")
    # Relative paths are read relative to the config file, as exporter-toolkit does.
    (tmp_path / "tls").mkdir()
    for src, name in ((cert, "s.crt"), (key, "s.key"), (clients.ca_cert, "ca.crt")):
        (tmp_path / "tls" / name).write_bytes(src.read_bytes())
    config = write_config(tmp_path, """
tls_server_config:
  cert_file: tls/s.crt
  key_file: tls/s.key
  client_ca_file: tls/ca.crt
  client_auth_type: RequireAndVerifyClientCert
  min_version: TLS12
""")
    server, _ = serve(config)
    running.append(server)
    status, _, body = get(server, client_context(pki, clients.leaf("scraper", server=False)))
    assert status == 200 and b"kvobs_" in body
    for context in (client_context(pki), client_context(pki, strangers.leaf("x", server=False))):
        with pytest.raises((ssl.SSLError, ConnectionError, http.client.HTTPException)):
            get(server, context)


def test_a_silent_client_does_not_hold_up_other_scrapes(
        tmp_path: Path, pki: Pki, server_pair: tuple[Path, Path], running: list) -> None:
    cert, key = server_pair
    server, _ = serve(write_config(
        tmp_path, f"tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n"))
    running.append(server)
    silent = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(4)]
    try:
        start = time.monotonic()
        status, _, _ = get(server, client_context(pki))
        # Bound: the handshake of the silent clients runs in their own threads, so this
        # scrape takes milliseconds; 5 s leaves room for a loaded 2-core CI machine.
        assert status == 200 and time.monotonic() - start < 5
    finally:
        for sock in silent:
            sock.close()


def test_basic_auth_without_tls_and_cached_checks(tmp_path: Path, running: list) -> None:
    slow_hash = hash_password(PASSWORD, rounds=10)  # ~0.1 s per bcrypt check here
    server, _ = serve(write_config(tmp_path, f"basic_auth_users:\n  p: '{slow_hash}'\n"))
    running.append(server)
    assert server.url.startswith("http://")
    assert get(server, None, ("p", PASSWORD))[0] == 200
    start = time.monotonic()
    for _ in range(20):
        assert get(server, None, ("p", PASSWORD))[0] == 200
    # 20 uncached cost-10 checks take >= 1 s on any machine; cached they are HTTP only.
    # The bound is generous (2-core CI under load): it only has to beat 20 bcrypt checks.
    assert time.monotonic() - start < 20 * bcrypt_seconds(slow_hash)
    assert get(server, None, ("p", "wrong"))[0] == 401


def bcrypt_seconds(hashed: str) -> float:
    start = time.monotonic()
    bcrypt.checkpw(b"x", hashed.encode())
    return time.monotonic() - start


def test_rotated_certificate_is_served_at_the_next_connection(
        tmp_path: Path, pki: Pki, running: list) -> None:
    first = pki.leaf("first", server=True)
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert.write_bytes(first[0].read_bytes())
    key.write_bytes(first[1].read_bytes())
    server, _ = serve(write_config(
        tmp_path, "tls_server_config:\n  cert_file: tls.crt\n  key_file: tls.key\n"))
    running.append(server)

    def served_cn() -> str:
        context = client_context(pki)
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as raw, \
                context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            peer = tls.getpeercert()
        return dict(item[0] for item in peer["subject"])["commonName"]

    assert served_cn() == "first"
    second = pki.leaf("second", server=True)
    cert.write_bytes(second[0].read_bytes())
    key.write_bytes(second[1].read_bytes())
    os.utime(cert, ns=(time.time_ns() + 10**9,) * 2)  # a new mtime even on coarse clocks
    assert served_cn() == "second"


def test_hanging_up_mid_response_leaves_the_server_serving(
        tmp_path: Path, pki: Pki, server_pair: tuple[Path, Path], running: list) -> None:
    cert, key = server_pair
    server, recorder = serve(write_config(
        tmp_path, f"tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n"))
    running.append(server)
    for i in range(60):  # many series, so the response spans several TLS records
        recorder.error(f"component.{i}")
    before = threading.active_count()
    for _ in range(10):
        raw = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        tls = client_context(pki).wrap_socket(raw, server_hostname="127.0.0.1")
        tls.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        tls.recv(64)
        tls.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        tls.close()  # RST while the server is still writing
    assert get(server, client_context(pki))[0] == 200
    deadline = time.monotonic() + 10
    while threading.active_count() > before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert threading.active_count() <= before  # no connection thread left behind


BAD_CONFIGS = [
    ("tls_server_config: [1]", "tls_server_config must be a mapping"),
    ("tls_servr_config: {}", "tls_servr_config is not a web config field"),
    ("tls_server_config:\n  cert_file: {cert}", "tls_server_config.key_file is required"),
    ("tls_server_config:\n  cert_file: {cert}\n  key_file: /nonexistent.key",
     "tls_server_config.key_file /nonexistent.key does not exist"),
    ("tls_server_config:\n  cert_file: {cert}\n  key_file: {cert}",
     "tls_server_config.cert_file"),
    ("tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n  client_ca_file: {cert}",
     "tls_server_config.client_ca_file is set without a client auth policy"),
    ("tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n"
     "  client_auth_type: RequireAndVerifyClientCert", "needs client_ca_file"),
    ("tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n  client_auth_type: Maybe",
     "tls_server_config.client_auth_type 'Maybe' is not one of"),
    ("tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n"
     "  client_auth_type: RequireAnyClientCert", "is not supported by kvobs"),
    ("tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n  min_version: TLS14",
     "tls_server_config.min_version 'TLS14' is not one of"),
    ("tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n  cipher_suites: [X]",
     "tls_server_config.cipher_suites is not supported"),
    ("basic_auth_users:\n  alice: hunter2", "basic_auth_users.alice must be a bcrypt hash"),
    ("basic_auth_users: [alice]", "basic_auth_users must be a mapping"),
    ("http_server_config:\n  headers:\n    Authorization: x",
     "http_server_config.headers.Authorization is set by the server"),
    ("http_server_config:\n  http3: true", "http_server_config.http3 is not a web config field"),
    ("tls_server_config: {cert_file: [", "is not valid YAML at line 1"),
]


@pytest.mark.parametrize(("text", "message"), BAD_CONFIGS, ids=[m for _, m in BAD_CONFIGS])
def test_bad_config_is_one_error_naming_the_field(
        tmp_path: Path, server_pair: tuple[Path, Path], text: str, message: str) -> None:
    cert, key = server_pair
    path = write_config(tmp_path, text.replace("{cert}", str(cert)).replace("{key}", str(key)))
    with pytest.raises(ConfigError) as error:
        load_web_config(path)
    assert message in str(error.value) and str(path) in str(error.value)
    assert "\n" not in str(error.value)


def test_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"--web-config-file .*nope.yml cannot be read"):
        load_web_config(tmp_path / "nope.yml")
