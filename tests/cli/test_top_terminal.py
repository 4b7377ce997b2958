"""``kvobs top`` and the demo's view in a real terminal: tmux runs them, we read the pane.

Each test starts its own tmux server (``-L``, a private socket, no user config), runs the
command in a pane of a given size, captures the pane as a person would see it, presses
keys, and checks how the program ended. tmux is a prerequisite: missing, the tests skip
locally and fail under CI (``.ci/run`` installs it).
"""

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.required import find_tool

HERE = Path(__file__).resolve().parent
KVOBS = f"{sys.executable} -m kvobs"


class Pane:
    """One tmux server with one pane running ``command``."""

    def __init__(self, tmux, tmp_path, command, width, height):
        self.tmux = str(tmux)
        self.socket = f"kvobs-test-{os.getpid()}-{time.monotonic_ns()}"
        conf = tmp_path / "tmux.conf"
        conf.write_text("set -g status off\n")
        # The shell stays after the program ends, so its last output is not lost with the
        # pane, and says how the program exited.
        shell = (f"{command}; echo kvobs-exit=$?; "
                 "stty -a | grep -qw icanon && echo tty-restored; sleep 600")
        env = {k: v for k, v in os.environ.items() if not k.startswith("TMUX")}
        env.update(TERM="xterm-256color", COLUMNS="", LINES="")
        subprocess.run(
            [self.tmux, "-L", self.socket, "-f", str(conf), "new-session", "-d", "-s", "t",
             "-x", str(width), "-y", str(height), shell],
            check=True, env=env, timeout=30,
        )

    def _run(self, *args):
        return subprocess.run([self.tmux, "-L", self.socket, *args], capture_output=True,
                              text=True, timeout=30)

    def text(self):
        return self._run("capture-pane", "-p", "-t", "t").stdout

    def send(self, *keys):
        self._run("send-keys", "-t", "t", *keys)

    def status(self):
        """None while the command runs, else its exit status."""
        for line in self.text().splitlines():
            if line.startswith("kvobs-exit="):
                return int(line.removeprefix("kvobs-exit="))
        return None

    def wait_for(self, predicate, timeout=60, what="the expected screen"):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.text()
            if predicate(text):
                return text
            time.sleep(0.25)
        pytest.fail(f"timed out waiting for {what}; the pane shows:\n{self.text()}")

    def wait_exit(self, timeout=30):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            code = self.status()
            if code is not None:
                return code
            time.sleep(0.2)
        pytest.fail(f"the program did not exit; the pane shows:\n{self.text()}")

    def close(self):
        self._run("kill-server")


@pytest.fixture
def tmux():
    return find_tool("tmux", ".ci/run (it apt-get installs tmux)")


@pytest.fixture
def pane(tmux, tmp_path):
    panes = []

    def start(command, width=100, height=40):
        panes.append(Pane(tmux, tmp_path, command, width, height))
        return panes[-1]

    yield start
    for p in panes:
        p.close()


def free_addr():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


@pytest.fixture
def engine(tmp_path):
    procs = []

    def start(addr):
        url_file = tmp_path / f"url-{len(procs)}"
        proc = subprocess.Popen([sys.executable, str(HERE / "busy_engine.py"), str(url_file), addr],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(proc)
        deadline = time.monotonic() + 60
        while not (url_file.exists() and url_file.read_text()):
            assert proc.poll() is None and time.monotonic() < deadline, "engine did not start"
            time.sleep(0.1)
        return url_file.read_text()

    yield start
    for proc in procs:
        proc.terminate()
        proc.wait(timeout=10)


def test_top_shows_endpoints_retries_the_unreachable_and_quits_on_q(pane, engine):
    addr = free_addr()
    url = f"http://{addr}/metrics"
    dead = "http://127.0.0.1:1/metrics"
    view = pane(f"{KVOBS} top --url {url} --url {dead}", width=110, height=45)
    # nothing serves the first URL yet: shown as unreachable, and kept being retried
    view.wait_for(lambda t: t.count("unreachable") == 2 and "2 failed so far" in t,
                  what="two unreachable endpoints")
    engine(addr)
    screen = view.wait_for(lambda t: "busy · qwen2.5-0.5b" in t and "rates over" in t
                           and "hits (last interval)" in t, what="the engine's panel")
    assert screen.count("unreachable") == 1 and dead in screen
    for seen in ("gpu ", "host ", "in use", "cached", "capacity", "gpu→host", "host→gpu",
                 "p50", "p99", "drop", "fail", "thrash", "wasted offloads", "q quit"):
        assert seen in screen, seen
    assert "█" in screen and "▒" in screen  # the occupancy bars
    assert max(len(line) for line in screen.splitlines()) <= 110
    view.send("q")
    assert view.wait_exit() == 0
    after = view.wait_for(lambda t: "tty-restored" in t, timeout=10,
                          what="the terminal back in canonical mode")
    assert "Traceback" not in after and "busy · qwen2.5-0.5b" not in after  # screen restored


def test_top_reads_on_a_narrow_terminal_and_quits_on_ctrl_c(pane, engine):
    url = engine("127.0.0.1:0")
    view = pane(f"{KVOBS} top --url {url}", width=44, height=40)
    screen = view.wait_for(lambda t: "rates over" in t or "hits (last interval)" in t,
                           what="the narrow view")
    lines = screen.splitlines()
    assert max(len(line) for line in lines) <= 44
    assert any(line.startswith("│ gpu ") and "█" in line for line in lines), screen
    assert any("gpu→host" in line and "p50" in line for line in lines), screen
    view.send("C-c")
    assert view.wait_exit() == 0
    after = view.wait_for(lambda t: "tty-restored" in t, timeout=10,
                          what="the terminal back in canonical mode")
    assert "Traceback" not in after


def test_demo_on_a_terminal_shows_the_view_and_logs_to_a_file(pane, tmp_path):
    log = tmp_path / "demo.log"
    view = pane(
        f"{KVOBS} demo --duration 8 --warmup 5 --gpu-blocks 256 --host-blocks 1024 "
        f"--metrics-addr 127.0.0.1:0 --log-file {log}",
        width=100, height=40,
    )
    screen = view.wait_for(lambda t: "kvobs-demo · qwen2.5-0.5b" in t and "rates over" in t,
                           timeout=90, what="the demo's view")
    assert "│ gpu " in screen and "│ host " in screen, screen
    assert f"logs:{log}" in "".join(screen.split()), screen  # the footer may wrap
    assert view.wait_exit(timeout=60) == 0  # --duration ends it, and the view with it
    assert f"kvobs demo: logs in {log}" in view.text()
    events = [json.loads(line)["event"] for line in log.read_text().splitlines()]
    assert events[0] == "kv_cache_capacity" and events[-1] == "demo_stopped"
    assert "metrics_serving" in events
