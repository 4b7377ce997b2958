"""kvobs as a new user installs it: build the sdist and the wheel, install the wheel with
only the demo extra into a fresh venv, and run every subcommand for real: ``capacity``,
``whatif`` on a small trace, ``dashboards --out``, a short ``demo`` watched by ``top
--once``, and last (after the report extra is added) ``report`` against a real
Prometheus that scrapes a demo and loads the rules ``dashboards --out`` wrote.

The build runs on a copy of the checkout (tracked and untracked-but-not-ignored files),
so it never writes into the working tree. The wheel is built from the sdist, which
checks the sdist is complete; it runs through the README's ``make dist``. The fresh venv
gets ``torch==2.13.0`` first (from ``TORCH_INDEX_URL`` when set, as ``make`` does: a
bare ``torch`` requirement would pull a CUDA build where pip's index is the default), then
``kvobs[demo]`` from the wheel, and nothing else: no grafanalib, no matplotlib.

Missing prerequisites (the ``build`` package, ``venv``/``ensurepip``, the Prometheus
binary of ``scripts/deps/prometheus.sh``) skip locally and fail under CI.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import time
import urllib.request
import venv
import zipfile
from pathlib import Path

import pytest

from tests.e2e.e2e_servers import Server, http_ok, poll, start_prometheus
from tests.required import REPO, find_tool, missing

TORCH_PIN = "torch==2.13.0"

def _subcommands() -> list[str]:
    from kvobs.cli import build_parser

    parser = build_parser()
    (action,) = [a for a in parser._actions if a.dest == "command"]
    return sorted(action.choices)


SUBCOMMANDS = _subcommands()
GENERATED = sorted((REPO / "dashboards" / "generated").glob("*.json"))
RULES = sorted((REPO / "dashboards" / "rules").glob("*.rules.yaml"))


def _source_copy(dest: Path) -> Path:
    listed = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True, check=True,
    ).stdout.decode().split("\0")
    for name in filter(None, listed):
        src = REPO / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    return dest


@pytest.fixture(scope="module")
def dist(tmp_path_factory):
    try:
        import build  # noqa: F401
    except ImportError:
        missing("the `build` package is not installed: run `make setup` (it is in kvobs[dev])")
    if shutil.which("git") is None:
        missing("git is not installed; the build copies the checkout's files with git ls-files")
    if shutil.which("make") is None:
        missing("make is not installed; the build runs the README's `make dist`")
    src = _source_copy(tmp_path_factory.mktemp("src"))
    started = time.monotonic()
    # The README's `make dist`, with this interpreter's venv standing in for .venv (-o: it
    # counts as set up, so make never reinstalls into it).
    prefix = Path(sys.prefix)
    result = subprocess.run(["make", "-C", str(src), "dist", f"VENV={prefix}",
                             "-o", str(prefix / "bin" / "kvobs")],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = src / "dist"
    print(f"built sdist + wheel in {time.monotonic() - started:.1f} s")
    (sdist,) = out.glob("kvobs-*.tar.gz")
    (wheel,) = out.glob("kvobs-*.whl")
    return sdist, wheel


def test_wheel_ships_the_generated_dashboards_unchanged(dist):
    _sdist, wheel = dist
    assert GENERATED, "dashboards/generated/ is empty: run `kvobs dashboards --regenerate`"
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        for path in GENERATED:
            shipped = f"kvobs/dashboards/generated/{path.name}"
            assert shipped in names, f"{shipped} is missing from the wheel"
            assert zf.read(shipped) == path.read_bytes(), f"{shipped} differs from {path}"
        assert not [n for n in names if n.startswith("kvobs/dashboards/generated/")
                    and n.rsplit("/", 1)[-1] not in {p.name for p in GENERATED}]
        for needed in ("kvobs/top/app.py", "kvobs/cli/top_cmd.py", "kvobs/report/boards.py",
                       "kvobs/dashboards/rules/kvobs-alerts.rules.yaml"):
            assert needed in names, needed
        # the C extension, built (required: the wheel carries it, the sdist its sources)
        assert [n for n in names if n.startswith("kvobs/kernels/_native.") and n.endswith(".so")]
        meta = zf.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
        entry_points = zf.read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    for extra in ("demo", "report", "nvml", "dev"):
        assert f"Provides-Extra: {extra}" in meta
    assert "Requires-Dist: torch>=2.4; extra == \"demo\"" in meta
    assert "Requires-Dist: matplotlib>=3.8; extra == \"report\"" in meta
    assert "kvobs = kvobs.cli:main" in entry_points


def test_sdist_holds_what_the_wheel_is_built_from(dist):
    sdist, _wheel = dist
    with tarfile.open(sdist) as tf:
        names = {n.split("/", 1)[1] for n in tf.getnames() if "/" in n}
    sources = sorted(p.relative_to(REPO).as_posix() for pattern in ("*.c", "*.h")
                     for p in (REPO / "kernels").glob(pattern))  # what setup.py builds
    assert "kernels/module.c" in sources
    for needed in ("README.md", *sources, "setup.py", "pyproject.toml",
                   "MANIFEST.in", *(f"dashboards/generated/{p.name}" for p in GENERATED)):
        assert needed in names, needed


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def fresh_venv(dist, tmp_path_factory):
    try:
        import ensurepip  # noqa: F401
    except ImportError:
        missing("ensurepip is missing: apt-get install python3-venv (.ci/run does)")
    _sdist, wheel = dist
    root = tmp_path_factory.mktemp("venv") / "v"
    started = time.monotonic()
    venv.EnvBuilder(with_pip=True, clear=True).create(root)
    python = root / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    torch_from = ["--index-url", index] if (index := os.environ.get("TORCH_INDEX_URL")) else []
    for args in (["install", "-q", *torch_from, TORCH_PIN], ["install", "-q", f"{wheel}[demo]"]):
        result = subprocess.run([str(python), "-m", "pip", *args], capture_output=True,
                                text=True, timeout=900, env=env)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    print(f"fresh venv with {TORCH_PIN} and kvobs[demo] in {time.monotonic() - started:.1f} s")
    return root, env


def _run(venv_root, env, *args, timeout=120, cwd=None, umask=None):
    """A command of the venv, run outside the checkout (so the checkout's kvobs is not
    on ``sys.path``)."""
    return subprocess.run([str(venv_root / "bin" / args[0]), *args[1:]], capture_output=True,
                          text=True, timeout=timeout, env=env, cwd=cwd or venv_root,
                          preexec_fn=None if umask is None else (lambda: os.umask(umask)))


def _one_line_error(result, *parts):
    """Exit 2 and one ``kvobs: error:`` line holding every one of ``parts``."""
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, (result.returncode, result.stderr)
    assert lines[0].startswith("kvobs: error: ") and all(p in lines[0] for p in parts), lines


def test_fresh_venv_has_only_what_the_demo_extra_says(fresh_venv):
    root, env = fresh_venv
    probe = ("import importlib.util as u; "
             "print([m for m in ('torch', 'rich', 'grafanalib', 'matplotlib') "
             "if u.find_spec(m)])")
    result = _run(root, env, "python", "-c", probe)
    # the demo's torch and the view's rich; not the dashboard generator, not the report's
    assert result.stdout.strip() == "['torch', 'rich']", result.stdout + result.stderr
    result = _run(root, env, "python", "-c",
                  "import kvobs; print(kvobs.__file__); print(sorted(kvobs.__all__))")
    assert str(REPO) not in result.stdout.splitlines()[0]  # the installed copy, not the checkout
    assert "start_telemetry" in result.stdout


def test_every_subcommand_helps_and_capacity_plans(fresh_venv, tmp_path):
    root, env = fresh_venv
    for args in (["--help"], *([name, "--help"] for name in SUBCOMMANDS)):
        result = _run(root, env, "kvobs", *args, cwd=tmp_path)
        assert result.returncode == 0 and "usage: kvobs" in result.stdout, (args, result.stderr)
    result = _run(root, env, "kvobs", "capacity", "--model", "llama-3-8b", "--gpu-kv-gib", "16",
                  "--host-pool-gib", "120", "--request-tokens", "32768", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "Maximum concurrency for 32,768 tokens per request: 4.00x" in result.stdout
    tiny = _run(root, env, "kvobs", "capacity", "--model", "llama-3-8b", "--gpu-kv-gib",
                "0.001", cwd=tmp_path)
    _one_line_error(tiny, "--gpu-kv-gib 0.001 holds no KV block", "pass --gpu-kv-gib 0.00196")


def test_whatif_replays_a_trace(fresh_venv, tmp_path):
    root, env = fresh_venv
    trace = tmp_path / "trace.jsonl"
    with trace.open("w") as lines:  # three prompts of 8 blocks, taken in turn
        for i in range(30):
            blocks = [f"prompt{i % 3}-block{j}" for j in range(8)]
            lines.write(json.dumps({"blocks": blocks, "ts": i}) + "\n")
    result = _run(root, env, "kvobs", "whatif", "--trace", str(trace), "--sizes", "8,32",
                  cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "240 block references (exact LRU replay)" in result.stdout
    rows = [line.split() for line in result.stdout.splitlines()[2:]]
    assert rows == [["8", "0.00%"], ["32", "90.00%"]], result.stdout  # LRU: all or nothing
    tiers = _run(root, env, "kvobs", "whatif", "--trace", str(trace), "--model", "qwen2.5-0.5b",
                 "--gpu-gib", "0.001", "--host-gib", "0.01", "--json", cwd=tmp_path)
    assert tiers.returncode == 0, tiers.stderr
    assert json.loads(tiers.stdout)["host"][0]["host_hit_ratio"] == pytest.approx(0.9)


def test_dashboards_out_writes_what_grafana_and_prometheus_load(fresh_venv, tmp_path):
    root, env = fresh_venv
    out = tmp_path / "provisioning"
    result = _run(root, env, "kvobs", "dashboards", "--out", str(out), cwd=tmp_path)
    assert result.returncode == 0, result.stderr  # no grafanalib in this venv
    for folder, committed in (("dashboards", GENERATED), ("rules", RULES)):
        assert sorted(p.name for p in (out / folder).iterdir()) == [p.name for p in committed]
        for path in committed:
            assert (out / folder / path.name).read_bytes() == path.read_bytes(), path
    missing_parent = _run(root, env, "kvobs", "dashboards", "--out", str(tmp_path / "a" / "b"))
    _one_line_error(missing_parent, "--out", f"directory {tmp_path / 'a'} does not exist")
    regenerate = _run(root, env, "kvobs", "dashboards", "--regenerate", cwd=tmp_path)
    _one_line_error(regenerate, "--regenerate renders from the dashboards/*.py of a source "
                    "checkout", "use --out DIR")


def test_missing_extras_are_one_line_naming_the_pip_install(fresh_venv, tmp_path):
    root, env = fresh_venv
    report = _run(root, env, "kvobs", "report", "--prometheus", "http://127.0.0.1:1",
                  "--out", str(tmp_path / "t.png"))
    assert report.returncode == 2
    line = report.stderr.strip()
    assert line.startswith("kvobs: error: kvobs report needs matplotlib"), line
    assert line.endswith(": pip install 'kvobs[report]'") and "\n" not in line
    boards = _run(root, env, "python", "-c",
                  "from kvobs.report.boards import dashboard_stems, dashboard_json; "
                  "print(dashboard_stems(), dashboard_json('kvobs-tiers')['uid'])")
    assert boards.stdout.strip() == (
        f"{sorted(p.stem for p in GENERATED)} kvobs-tiers"), boards.stderr  # no grafanalib needed


def test_five_second_demo_is_watched_by_kvobs_top(fresh_venv, tmp_path):
    root, env = fresh_venv
    port = _free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    demo = subprocess.Popen(
        [str(root / "bin" / "kvobs"), "demo", "--duration", "5", "--warmup", "10",
         "--gpu-blocks", "256", "--host-blocks", "1024", "--metrics-addr", f"127.0.0.1:{port}",
         "--summary-interval", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path,
    )
    try:
        deadline, seen = time.monotonic() + 90, ""
        while time.monotonic() < deadline and demo.poll() is None:
            top = _run(root, {**env, "COLUMNS": "100"}, "kvobs", "top", "--once", "--url", url,
                       "--interval", "0.5", timeout=30)
            seen = top.stdout
            if top.returncode == 0 and "rates over" in seen:
                break
            time.sleep(0.5)
        assert "kvobs-demo · qwen2.5-0.5b" in seen and "gpu→host" in seen, seen
        assert "hits (" in seen and "host " in seen and "quit" not in seen
        _out, err = demo.communicate(timeout=60)
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.communicate()
    assert demo.returncode == 0, err[-3000:]
    events = [json.loads(line)["event"] for line in err.splitlines() if line.startswith("{")]
    assert events[0] == "kv_cache_capacity" and events[-1] == "demo_stopped", events
    assert "kv_cache_summary" in events
    too_small = _run(root, env, "kvobs", "demo", "--gpu-blocks", "4", "--host-blocks", "0",
                     "--metrics-addr", "127.0.0.1:0", cwd=tmp_path)
    _one_line_error(too_small, "--gpu-blocks 4", "cannot hold one request",
                    "pass --gpu-blocks 185 or more")


def test_readme_example_runs_against_the_installed_package(fresh_venv, tmp_path):
    root, env = fresh_venv
    from tests.cli.test_front_door import readme_example
    script = tmp_path / "readme.py"
    script.write_text(
        "import doctest, sys\n"
        f"test = doctest.DocTestParser().get_doctest({readme_example()!r}, {{}}, 'README', "
        "'README', 0)\n"
        "runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)\n"
        "runner.run(test)\n"
        "sys.exit(1 if runner.failures else 0)\n"
    )
    result = _run(root, env, "python", str(script), cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


# Last in this file: the report extra is added to the module's venv, after the tests that
# check what the demo extra alone brings.


@pytest.fixture(scope="module")
def report_venv(fresh_venv, dist):
    root, env = fresh_venv
    _sdist, wheel = dist
    started = time.monotonic()
    result = subprocess.run([str(root / "bin" / "python"), "-m", "pip", "install", "-q",
                             f"{wheel}[demo,report]"], capture_output=True, text=True,
                            timeout=900, env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    print(f"report extra added in {time.monotonic() - started:.1f} s")
    return root, env


def test_report_draws_a_demo_from_a_real_prometheus(report_venv, tmp_path):
    prometheus_binary = find_tool("prometheus", "scripts/deps/prometheus.sh")
    root, env = report_venv
    boards = _run(root, env, "kvobs", "dashboards", "--out", str(tmp_path / "boards"))
    assert boards.returncode == 0, boards.stderr
    port = _free_port()
    log = tmp_path / "demo.log"
    with log.open("wb") as handle:
        demo = Server(subprocess.Popen(
            [str(root / "bin" / "kvobs"), "demo", "--duration", "300", "--metrics-addr",
             f"127.0.0.1:{port}", "--gpu-blocks", "512", "--host-blocks", "2048", "--seed", "7",
             "--summary-interval", "0", "--view", "logs"],
            stdout=handle, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
            cwd=tmp_path), f"http://127.0.0.1:{port}", log)
    prometheus = None
    try:
        poll("kvobs demo /metrics", lambda: http_ok(demo.url + "/metrics"), 90, log)
        (tmp_path / "prometheus").mkdir()
        prometheus = start_prometheus(  # the rules as a user points rule_files at them
            prometheus_binary, tmp_path / "prometheus", [f"127.0.0.1:{port}"],
            [tmp_path / "boards" / "rules" / "*.rules.yaml"])
        out = tmp_path / "tiers.png"
        args = ("kvobs", "report", "--prometheus", prometheus.url, "--out", str(out),
                "--range", "2m", "--rate-interval", "15s")
        tries: list[str] = []

        def drawn():
            result = _run(root, env, *args, cwd=tmp_path, umask=0o022)
            tries.append(result.stderr.strip())
            return result if result.returncode == 0 else None

        result = poll(f"kvobs report to draw every panel (last: {tries[-1:]})", drawn, 90,
                      prometheus.log, interval_s=2.0)
        assert "panels of the kvobs-tiers dashboard" in result.stdout
        assert out.read_bytes().startswith(b"\x89PNG") and out.stat().st_mode & 0o777 == 0o644
        with urllib.request.urlopen(prometheus.url + "/api/v1/rules", timeout=5) as answer:
            groups = json.loads(answer.read())["data"]["groups"]
        assert {g["file"].rsplit("/", 1)[-1] for g in groups} == {p.name for p in RULES}
    finally:
        if prometheus is not None:
            prometheus.stop()
        demo.stop()
