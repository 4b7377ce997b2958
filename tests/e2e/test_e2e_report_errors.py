"""``kvobs report`` on bad input: one clear line naming the panel and query, exit 2, no file.

Each case talks to a real server: nothing listening, an HTTP server that is not
Prometheus, a real Prometheus without kvobs data, and a real Prometheus rejecting a query.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from kvobs.cli import main
from tests.e2e.e2e_servers import Server, free_port

FIRST_PANEL = "panel 'Capacity per tier (tokens)', query 'sum by (tier) (kvobs_tier_capacity_tokens"


class _NotPrometheus(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = b"<html>not here</html>"
        self.send_response(404)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args: object) -> None:
        pass


@pytest.fixture()
def not_prometheus() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _NotPrometheus)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def report(url: str, out: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> str:
    """Run the CLI; assert it failed cleanly and wrote nothing; return its one error line."""
    status = main(["report", "--prometheus", url, "--out", str(out), "--range", "5m",
                   "--timeout", "5", *extra])
    captured = capsys.readouterr()
    assert status == 2
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvobs: error: "), captured.err
    assert list(out.parent.iterdir()) == [], "a failed report left a file behind"
    return lines[0]


def test_unreachable_prometheus(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    error = report(url, tmp_path / "tiers.png", capsys)
    assert FIRST_PANEL in error
    assert f"cannot reach Prometheus at {url}" in error and "check --prometheus" in error


def test_a_server_that_is_not_prometheus(not_prometheus: str, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    error = report(not_prometheus, tmp_path / "tiers.png", capsys)
    assert FIRST_PANEL in error
    assert "answered HTTP 404" in error and "is this a Prometheus server?" in error


def test_prometheus_without_kvobs_data(bare_prometheus: Server, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    error = report(bare_prometheus.url, tmp_path / "tiers.png", capsys)
    assert FIRST_PANEL in error
    assert "no data between" in error and "--job/--model/--instance" in error


def test_prometheus_rejects_the_query(bare_prometheus: Server, tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    # a regex Python accepts (kvobs checks filters at parse) and Prometheus's RE2 refuses
    error = report(bare_prometheus.url, tmp_path / "tiers.png", capsys, "--model",
                   "llama(?=3)")
    assert FIRST_PANEL in error and 'model=~"llama(?=3)"' in error
    assert "Prometheus rejected the query (bad_data)" in error


def test_an_existing_png_survives_a_failed_report(bare_prometheus: Server, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "tiers.png"
    out.write_bytes(b"previous report")
    status = main(["report", "--prometheus", bare_prometheus.url, "--out", str(out)])
    assert status == 2 and "no data" in capsys.readouterr().err
    assert out.read_bytes() == b"previous report"
    assert [p.name for p in tmp_path.iterdir()] == ["tiers.png"]


@pytest.mark.parametrize("args,message", [
    ([], "--prometheus is required"),
    (["--prometheus", "127.0.0.1:9090", "--out", "x.png"], "is not an http(s) URL"),
    (["--prometheus", "http://127.0.0.1:9", "--out", "x.jpg"], "give a path ending in .png"),
    (["--prometheus", "http://127.0.0.1:9", "--out", "x.png", "--rate-interval", "1 min"],
     "--rate-interval '1 min' is not a duration"),
])
def test_bad_flags(args: list[str], message: str, tmp_path: Path,
                   capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["report", *args]) == 2
    assert message in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
