"""Bad input across the CLI: one line naming the flag and the fix, exit 2, nothing heavy.

Every case runs ``kvobs.cli.main`` the way the console script does and checks what a
person sees: a single ``kvobs: error: ...`` line on stderr that names the flag, nothing on
stdout, no traceback. A subprocess with torch made unimportable shows that the demo
checks its flags before it loads torch or allocates a pool.
"""

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from kvobs.cli import main
from tests.required import need_torch

UNWRITABLE_DIR = "/proc"  # even root cannot create files there
CAPACITY = ["capacity", "--model", "llama-3-8b"]
REPORT = ["report", "--prometheus", "http://127.0.0.1:1"]


def cases(tmp):
    directory = str(tmp)
    return [
        # capacity: numbers
        ([*CAPACITY, "--gpu-kv-gib", "inf"], "--gpu-kv-gib", "not a finite number"),
        ([*CAPACITY, "--gpu-kv-gib=-inf"], "--gpu-kv-gib", "not a finite number"),
        ([*CAPACITY, "--gpu-kv-gib", "nan"], "--gpu-kv-gib", "not a finite number"),
        ([*CAPACITY, "--gpu-kv-gib", "1e30"], "--gpu-kv-gib", "too large: use at most"),
        ([*CAPACITY, "--gpu-kv-gib", ""], "--gpu-kv-gib", "'' is not a number"),
        ([*CAPACITY, "--gpu-kv-gib", "1", "--host-pool-gib", "nan"], "--host-pool-gib",
         "not a finite number"),
        ([*CAPACITY, "--gpu-kv-gib", "1", "--request-tokens", "99999999999"],
         "--request-tokens", "too large"),
        ([*CAPACITY, "--gpu-kv-gib", "1", "--block-size", "0"], "--block-size", "must be > 0"),
        # capacity: files and names
        (["capacity", "--model-config", directory, "--gpu-kv-gib", "1"], "--model-config",
         "is a directory"),
        (["capacity", "--model-config", "", "--gpu-kv-gib", "1"], "--model-config", "empty"),
        (["capacity", "--model", "", "--gpu-kv-gib", "1"], "--model", "no model given"),
        ([*CAPACITY, "--gpu-kv-gib", "1", "--kv-dtype", "int3"], "--kv-dtype",
         "is not supported"),
        # demo
        (["demo", "--metrics-addr", ""], "--metrics-addr", "use HOST:PORT"),
        (["demo", "--metrics-addr", "127.0.0.1:99999"], "--metrics-addr", "use HOST:PORT"),
        (["demo", "--duration", "inf"], "--duration", "not a finite number"),
        (["demo", "--duration", "nan"], "--duration", "not a finite number"),
        (["demo", "--rate", "1e9"], "--rate", "too large"),
        (["demo", "--warmup", "1e9"], "--warmup", "too large"),
        (["demo", "--gpu-blocks", "1e3"], "--gpu-blocks", "is not an integer"),
        (["demo", "--host-blocks", str(2**40)], "--host-blocks", "too large"),
        (["demo", "--seed", "-1"], "--seed", "must be >= 0"),
        (["demo", "--otlp-endpoint", ""], "--otlp-endpoint", "not an http(s) URL"),
        (["demo", "--otlp-endpoint", "localhost:4318"], "--otlp-endpoint", "not an http(s) URL"),
        (["demo", "--log-file", directory], "--log-file", "is a directory"),
        (["demo", "--log-file", ""], "--log-file", "empty"),
        (["demo", "--log-file", f"{UNWRITABLE_DIR}/kvobs/demo.log"], "--log-file",
         "cannot be written"),
        (["demo", "--view", "fancy"], "--view", "invalid choice"),
        (["demo", "--warmup", "0", "--gpu-blocks", str(2**31), "--metrics-addr", "127.0.0.1:0"],
         "--gpu-blocks", "pass fewer blocks"),
        (["demo", "--warmup", "0", "--gpu-blocks", "4", "--host-blocks", "0",
          "--metrics-addr", "127.0.0.1:0"], "--gpu-blocks",
         "cannot hold one request of the demo workload (up to 2,960 tokens = 185 blocks of 16): "
         "pass --gpu-blocks 185 or more"),
        (["demo", "--log-file", f"{directory}/missing/demo.log"], "--log-file",
         f"directory {directory}/missing does not exist"),
        # capacity: a tier that holds no block
        ([*CAPACITY, "--gpu-kv-gib", "0.001"], "--gpu-kv-gib",
         "--gpu-kv-gib 0.001 holds no KV block of llama-3-8b (2,097,152 bytes per block of 16 "
         "tokens): pass --gpu-kv-gib 0.00196 or more"),
        ([*CAPACITY, "--gpu-kv-gib", "1", "--host-pool-gib", "0.0001"], "--host-pool-gib",
         "holds no KV block"),
        ([*CAPACITY, "--gpu-kv-gib", "1", "--disk-gib", "1e-9"], "--disk-gib",
         "holds no KV block"),
        # report
        ([*REPORT, "--out", directory], "--out", "is a directory"),
        ([*REPORT, "--out", ""], "--out", "empty"),
        ([*REPORT, "--out", f"{UNWRITABLE_DIR}/tiers.png"], "--out", "cannot be written"),
        ([*REPORT, "--out", "tiers.jpg"], "--out", "give a path ending in .png"),
        (["report", "--prometheus", "", "--out", "t.png"], "--prometheus", "http(s) URL"),
        ([*REPORT, "--out", "t.png", "--range", "99999d"], "--range", "too long"),
        ([*REPORT, "--out", "t.png", "--timeout", "inf"], "--timeout", "not a finite number"),
        ([*REPORT, "--out", f"{directory}/missing/r.png"], "--out",
         f"directory {directory}/missing does not exist: create it first"),
        ([*REPORT, "--out", "t.png", "--range", "-5m"], "--range",
         "'-5m' is negative: pass how far back to draw, e.g. 15m or 2h"),
        ([*REPORT, "--out", "t.png", "--range=-5m"], "--range", "is negative"),
        ([*REPORT, "--out", "t.png", "--range", "5 minutes"], "--range", "not a duration"),
        ([*REPORT, "--out", "t.png", "--rate-interval", "-1m"], "--rate-interval",
         "not a duration like 1m"),
        # top
        (["top", "--url", ""], "--url", "not an http(s) URL"),
        (["top", "--url", "ftp://x/metrics"], "--url", "not an http(s) URL"),
        (["top", "--url", "http://x:99999/metrics"], "--url", "invalid port"),
        (["top", "--interval", "0"], "--interval", "must be > 0"),
        (["top", "--interval", "inf"], "--interval", "not a finite number"),
        (["top", "--interval", "0.01"], "--interval", "use at least 0.1"),
        (["top", "--timeout", "nan"], "--timeout", "not a finite number"),
        # dashboards
        (["dashboards", "--root", directory], "--root", "has no dashboards/ directory"),
        (["dashboards"], "--out", "--out is required: pass the directory"),
        (["dashboards", "--out", f"{directory}/missing/boards"], "--out",
         f"directory {directory}/missing does not exist: create it first"),
        (["dashboards", "--out", ""], "--out", "empty"),
        (["dashboards", "--out", UNWRITABLE_DIR], "--out", "not writable"),
        (["dashboards", "--out", directory, "--root", directory], "--root",
         "goes with --regenerate or --check"),
        (["dashboards", "--out", directory, "--check"], "--out", "not allowed with"),
    ]


def test_every_bad_flag_is_one_line_naming_it(tmp_path, capsys, monkeypatch):
    need_torch()  # two demo cases build its pool before they refuse
    monkeypatch.chdir(tmp_path)
    for key in [k for k in os.environ if k.startswith("KVOBS_")]:
        monkeypatch.delenv(key)
    problems = []
    for args, flag, message in cases(tmp_path):
        status = main(args)
        captured = capsys.readouterr()
        lines = captured.err.strip().splitlines()
        ok = (status == 2 and captured.out == "" and len(lines) == 1
              and lines[0].startswith("kvobs: error: ") and flag in lines[0]
              and message in lines[0] and "Traceback" not in captured.err)
        if not ok:
            problems.append(f"{args}: status {status}, stderr {captured.err!r}")
    assert not problems, "\n".join(problems)
    assert list(tmp_path.iterdir()) == []  # no probe or partial file left behind


@pytest.mark.parametrize(("env", "args", "message"), [
    ({"KVOBS_URL": "nope"}, ["top"], "environment variable KVOBS_URL='nope' is invalid"),
    ({"KVOBS_GPU_KV_GIB": "inf"}, CAPACITY, "KVOBS_GPU_KV_GIB='inf' is invalid"),
    ({"KVOBS_LOG_FILE": "/proc/x.log"}, ["demo"], "KVOBS_LOG_FILE='/proc/x.log' is invalid"),
    ({"KVOBS_CHECK": "1"}, ["dashboards", "--out", "."],
     "--out and --check are both set (one of them by KVOBS_DASHBOARDS_OUT or KVOBS_CHECK)"),
    ({"KVOBS_DASHBOARDS_OUT": "/nonexistent/boards"}, ["dashboards"],
     "KVOBS_DASHBOARDS_OUT='/nonexistent/boards' is invalid: /nonexistent/boards cannot be "
     "created: directory /nonexistent does not exist"),
    ({"KVOBS_RANGE": "-5m"}, ["report"], "KVOBS_RANGE='-5m' is invalid: '-5m' is negative"),
])
def test_bad_environment_twins_name_the_variable(env, args, message, capsys, monkeypatch):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert main(args) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def run_without(module, *args):
    """Run the CLI in a fresh interpreter where ``import module`` fails."""
    code = (f"import sys; sys.modules[{module!r}] = None\n"
            "from kvobs.cli import main\n"
            f"sys.exit(main({list(args)!r}))\n")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)


def test_demo_checks_flags_before_torch_and_the_port_before_the_pools():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        # torch is never reached: the taken port is reported first
        result = run_without("torch", "demo", "--metrics-addr", f"127.0.0.1:{port}")
    assert result.returncode == 2
    assert f"port {port} is already in use" in result.stderr
    assert "torch" not in result.stderr and "Traceback" not in result.stderr


def test_missing_extras_name_the_pip_install():
    demo = run_without("torch", "demo", "--metrics-addr", "127.0.0.1:0")
    assert demo.returncode == 2
    assert demo.stderr.strip() == (
        "kvobs: error: kvobs demo needs torch (its pool moves real bytes): "
        "pip install 'kvobs[demo]'"
    )
    report = run_without("matplotlib", *REPORT, "--out", "never.png")
    assert report.returncode == 2
    assert report.stderr.strip() == (
        "kvobs: error: kvobs report needs matplotlib: pip install 'kvobs[report]'"
    )
    assert not Path("never.png").exists()
