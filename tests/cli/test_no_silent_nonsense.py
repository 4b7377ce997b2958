"""What the console script does where it used to do something quietly wrong.

Each test runs ``kvobs`` in a subprocess, as a person would: the shipped dashboards and
rules written with ``--out``, a report PNG with the user's umask, ``KVOBS_MODEL`` (the
model preset) never read as the report's label filter, ``KVOBS_TIMEOUT`` with one meaning,
a bad variable stopping only the subcommand it belongs to, and ``top --once`` printing no
key help. ``kvobs report`` talks to a stand-in Prometheus that answers every query with
one series and records the queries it was asked.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def kvobs(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None,
          umask: int | None = None) -> subprocess.CompletedProcess[str]:
    """The CLI in a fresh interpreter, with no ``KVOBS_*`` variable but those in ``env``."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("KVOBS_")}
    code = "import sys; from kvobs.cli import main; sys.exit(main())"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          timeout=120, env={**clean, **(env or {})}, cwd=cwd,
                          preexec_fn=None if umask is None else (lambda: os.umask(umask)))


class _Prometheus(BaseHTTPRequestHandler):
    """Every query (a form POST, as kvobs sends it) has one series; ``le`` is for the
    heatmaps."""

    queries: list[str]

    def do_POST(self) -> None:
        form = self.rfile.read(int(self.headers.get("Content-Length", 0))).decode()
        url = urllib.parse.urlparse(self.path)
        params = dict(urllib.parse.parse_qsl(url.query or form))
        self.queries.append(params.get("query", ""))
        metric = {"le": "+Inf", "tier": "gpu"}
        if url.path == "/api/v1/query_range":
            start, step = float(params["start"]), float(params["step"])
            data = {"resultType": "matrix", "result": [
                {"metric": metric, "values": [[start + i * step, str(i)] for i in range(5)]}]}
        else:
            data = {"resultType": "vector", "result": [{"metric": metric, "value": [0, "1"]}]}
        body = json.dumps({"status": "success", "data": data}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args: object) -> None:
        pass


@pytest.fixture
def prometheus() -> Iterator[tuple[str, list[str]]]:
    queries: list[str] = []
    handler = type("Handler", (_Prometheus,), {"queries": queries})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", queries
    finally:
        server.shutdown()
        server.server_close()


def test_dashboards_out_writes_the_shipped_files(tmp_path: Path) -> None:
    out = tmp_path / "provisioning"
    result = kvobs("dashboards", "--out", str(out), umask=0o027)
    assert result.returncode == 0, result.stderr
    shipped = {
        **{f"dashboards/{p.name}": p for p in (REPO / "dashboards" / "generated").glob("*.json")},
        **{f"rules/{p.name}": p for p in (REPO / "dashboards" / "rules").glob("*.rules.yaml")},
    }
    written = {str(p.relative_to(out)): p for p in out.rglob("*") if p.is_file()}
    assert sorted(written) == sorted(shipped)
    for rel, path in written.items():
        assert path.read_bytes() == shipped[rel].read_bytes(), rel
        assert path.stat().st_mode & 0o777 == 0o640, rel
    assert f"rule_files: ['{out}/rules/*.rules.yaml']" in result.stdout
    again = kvobs("dashboards", "--out", str(out))  # an upgrade rewrites them in place
    assert again.returncode == 0 and again.stdout.count("wrote ") == len(shipped)


def test_dashboards_out_refuses_a_missing_parent(tmp_path: Path) -> None:
    result = kvobs("dashboards", "--out", str(tmp_path / "no" / "such"))
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.strip().splitlines() == [
        f"kvobs: error: argument --out: {tmp_path}/no/such cannot be created: directory "
        f"{tmp_path}/no does not exist: create it first or pick an existing directory "
        "(see `kvobs dashboards --help`)"]
    assert not (tmp_path / "no").exists()


def test_report_png_follows_the_umask(prometheus: tuple[str, list[str]],
                                      tmp_path: Path) -> None:
    url, _queries = prometheus
    out = tmp_path / "tiers.png"
    result = kvobs("report", "--prometheus", url, "--out", str(out), umask=0o022)
    assert result.returncode == 0, result.stderr
    assert out.stat().st_mode & 0o777 == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["tiers.png"]


def test_report_out_in_a_missing_directory_creates_nothing(
        prometheus: tuple[str, list[str]], tmp_path: Path) -> None:
    url, queries = prometheus
    result = kvobs("report", "--prometheus", url, "--out", str(tmp_path / "nope" / "r.png"))
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert "--out" in result.stderr and "does not exist" in result.stderr
    assert not queries and not (tmp_path / "nope").exists()


@pytest.mark.parametrize(("env", "matcher", "warning"), [
    ({"KVOBS_MODEL": "llama-3-8b"}, 'model=~".*"', ""),  # the preset of capacity: ignored
    ({"KVOBS_REPORT_MODEL": "meta-llama/.*"}, 'model=~"meta-llama/.*"', ""),
    ({"KVOBS_REPORT_MODEL": "qwen.*", "KVOBS_MODEL": "llama-3-8b"}, 'model=~"qwen.*"', ""),
    ({"KVOBS_MODEL": "meta-llama/.*"}, 'model=~".*"', ""),  # never the filter, whatever it holds
    ({"KVOBS_JOB": "vllm"}, 'job=~".*"', ""),  # the filters are KVOBS_REPORT_* only
])
def test_kvobs_model_is_the_preset_not_the_report_filter(
        prometheus: tuple[str, list[str]], tmp_path: Path, env: dict[str, str], matcher: str,
        warning: str) -> None:
    url, queries = prometheus
    result = kvobs("report", "--prometheus", url, "--out", str(tmp_path / "r.png"), env=env)
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip() == warning
    label = matcher.split("=~", 1)[0]
    assert queries and all(matcher in q for q in queries if f"{label}=~" in q), queries[:3]


def test_report_help_names_the_filter_variables() -> None:
    result = kvobs("report", "--help", env={"COLUMNS": "200"})
    assert "KVOBS_REPORT_MODEL" in result.stdout
    assert "KVOBS_MODEL is the model preset of capacity, demo and whatif" in result.stdout


def test_a_report_filter_that_is_no_regex_is_one_line(
        prometheus: tuple[str, list[str]], tmp_path: Path) -> None:
    url, queries = prometheus
    result = kvobs("report", "--prometheus", url, "--out", str(tmp_path / "r.png"),
                   env={"KVOBS_REPORT_MODEL": "llama-(3"})
    assert result.returncode == 2 and not queries, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("kvobs: error: environment variable KVOBS_REPORT_MODEL='llama-(3' "
                           "is invalid: 'llama-(3' is not a regex"), line


@pytest.mark.parametrize("seconds", ["120", "600"])
def test_kvobs_timeout_means_the_same_in_top_and_report(
        prometheus: tuple[str, list[str]], tmp_path: Path, seconds: str) -> None:
    url, _queries = prometheus
    env = {"KVOBS_TIMEOUT": seconds}
    report = kvobs("report", "--prometheus", url, "--out", str(tmp_path / "r.png"), env=env)
    assert report.returncode == 0, report.stderr
    top = kvobs("top", "--once", "--url", "http://127.0.0.1:1/metrics", env=env)
    assert top.returncode == 1 and top.stderr == "", top.stderr  # unreachable, not refused
    for command in ("top", "report"):
        shown = kvobs(command, "--help", env={**env, "COLUMNS": "200"}).stdout
        assert "seconds to wait for each HTTP answer (at most 600)" in shown
        assert f"[env KVOBS_TIMEOUT; default {float(seconds)}]" in shown


def test_kvobs_timeout_beyond_its_limit_is_one_line_in_both() -> None:
    for args in (["top", "--once"], ["report", "--out", "r.png"]):
        result = kvobs(*args, env={"KVOBS_TIMEOUT": "601"})
        assert result.returncode == 2 and result.stderr.strip().splitlines() == [
            "kvobs: error: environment variable KVOBS_TIMEOUT='601' is invalid: 601 is too "
            "large: use at most 600"], result.stderr


@pytest.mark.parametrize(("env", "other"), [
    ({"KVOBS_GPU_BLOCKS": "many"}, ["capacity", "--model", "llama-3-8b", "--gpu-kv-gib", "1"]),
    ({"KVOBS_REPORT_JOB": "(("}, ["top", "--once", "--url", "http://127.0.0.1:1/metrics"]),
    ({"KVOBS_INTERVAL": "0"}, ["report", "--help"]),
])
def test_a_variable_of_one_subcommand_never_stops_another(
        env: dict[str, str], other: list[str]) -> None:
    result = kvobs(*other, env=env)
    assert "error" not in result.stderr and result.returncode in (0, 1), result.stderr


def test_top_once_prints_no_key_help() -> None:
    result = kvobs("top", "--once", "--url", "http://127.0.0.1:1/metrics", "--interval", "0.1",
                   env={"COLUMNS": "100"})
    assert result.returncode == 1  # nothing reached
    assert "unreachable" in result.stdout and "refresh 0.1 s" in result.stdout
    assert "quit" not in result.stdout
