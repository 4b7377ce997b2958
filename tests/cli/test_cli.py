"""The CLI as a user runs it: a real subprocess, real HTTP, real exit codes."""

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

KVOBS = [sys.executable, "-m", "kvobs"]


def run(*args, env=None, timeout=60):
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [*KVOBS, *args], capture_output=True, text=True, timeout=timeout, env=full_env
    )


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def scrape(url):
    values = {}
    with urllib.request.urlopen(url, timeout=5) as response:
        for family in text_string_to_metric_families(response.read().decode()):
            for sample in family.samples:
                key = (
                    sample.name,
                    tuple(
                        sorted(
                            (k, v) for k, v in sample.labels.items() if k not in ("engine", "model")
                        )
                    ),
                )
                values[key] = sample.value
    return values


def test_demo_serves_host_hits_onloads_and_offloads():
    port = free_port()
    proc = subprocess.Popen(
        [
            *KVOBS,
            "demo",
            "--duration",
            "30",
            "--metrics-addr",
            f"127.0.0.1:{port}",
            "--log-format",
            "json",
            "--warmup",
            "30",
            "--summary-interval",
            "1",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline, values = time.monotonic() + 40, {}
        while time.monotonic() < deadline:
            try:
                values = scrape(f"http://127.0.0.1:{port}/metrics")
                if (
                    values.get(
                        (
                            "kvobs_transfer_blocks_total",
                            (("dst_tier", "gpu"), ("src_tier", "host")),
                        ),
                        0,
                    )
                    > 0
                ):
                    break
            except OSError:
                pass
            time.sleep(0.5)
        host_hits = values[("kvobs_lookup_tokens_total", (("outcome", "host_hit"),))]
        onloads = values[
            ("kvobs_transfer_blocks_total", (("dst_tier", "gpu"), ("src_tier", "host")))
        ]
        offloads = values[
            ("kvobs_transfer_blocks_total", (("dst_tier", "host"), ("src_tier", "gpu")))
        ]
        assert host_hits > 0 and onloads > 0 and offloads > 0
        assert values[("kvobs_tier_capacity_blocks", (("tier", "host"),))] == 8192
    finally:
        proc.terminate()  # SIGTERM: the demo stops cleanly
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    events = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    names = [e["event"] for e in events]
    assert names[0] == "kv_cache_capacity" and "host" in events[0]["tiers"]
    assert "kv_cache_summary" in names and names[-1] == "demo_stopped"


def test_capacity_json():
    result = run(
        "capacity",
        "--model",
        "llama-3-8b",
        "--gpu-kv-gib",
        "16",
        "--host-pool-gib",
        "120",
        "--request-tokens",
        "32768",
        "--json",
    )
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert plan["tiers"]["gpu"]["blocks"] == 8192
    assert plan["tiers"]["host"]["tokens"] == 983040
    assert plan["max_concurrency"] == 4.0
    assert plan["bounded_by"] == "gpu" and plan["tiers"]["host"]["role"] == "cache"


def test_capacity_with_a_primary_host_pool_names_the_tier_that_bounds_concurrency():
    result = run("capacity", "--model", "llama-3-8b", "--gpu-kv-gib", "16",
                 "--host-pool-gib", "8", "--request-tokens", "32768", "--host-role", "primary")
    assert result.returncode == 0, result.stderr
    assert "2.00x (bounded by the host tier; gpu 4.00x, host 2.00x)" in result.stdout
    assert "host pool is a primary store" in result.stdout
    bad = run("capacity", "--gpu-kv-gib", "16", "--host-role", "store")
    assert bad.returncode == 2 and "--host-role" in bad.stderr


def test_capacity_table_from_config_file(tmp_path):
    config = tmp_path / "config.json"
    config.write_text(
        json.dumps(
            {
                "num_hidden_layers": 27,
                "num_attention_heads": 16,
                "hidden_size": 2048,
                "kv_lora_rank": 512,
                "qk_rope_head_dim": 64,
                "torch_dtype": "bfloat16",
            }
        )
    )
    result = run(
        "capacity", "--model-config", str(config), "--gpu-kv-gib", "1", "--host-pool-gib", "4"
    )
    assert result.returncode == 0, result.stderr
    assert "31,104 bytes/token" in result.stdout and "(MLA)" in result.stdout
    assert "host pool holds" in result.stdout


def test_env_twin_sets_a_flag():
    result = run(
        "capacity",
        "--model",
        "llama-3-8b",
        "--json",
        env={"KVOBS_GPU_KV_GIB": "8", "KVOBS_HOST_POOL_GIB": "0"},
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["tiers"]["gpu"]["blocks"] == 4096


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["capacity", "--model", "llama-3-8b"], {}, "--gpu-kv-gib is required"),
        (
            ["capacity", "--model", "nope", "--gpu-kv-gib", "1"],
            {},
            "model preset 'nope' is unknown",
        ),
        (
            ["capacity", "--model-config", "/nonexistent.json", "--gpu-kv-gib", "1"],
            {},
            "does not exist",
        ),
        (
            ["capacity", "--model", "llama-3-8b", "--gpu-kv-gib", "-3"],
            {},
            "--gpu-kv-gib: -3 must be > 0",
        ),
        (["demo", "--gpu-blocks", "0"], {}, "--gpu-blocks: 0 must be > 0"),
        (
            ["demo", "--duration", "1"],
            {"KVOBS_HOST_BLOCKS": "lots"},
            "KVOBS_HOST_BLOCKS='lots' is invalid",
        ),
        (
            ["demo", "--duration", "1", "--metrics-addr", "nonsense"],
            {},
            "--metrics-addr: 'nonsense' is invalid",
        ),
    ],
)
def test_bad_input_is_one_clear_line(args, env, message):
    result = run(*args, env=env)
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_demo_port_in_use_is_one_clear_line():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = run(
            "demo",
            "--duration",
            "1",
            "--warmup",
            "0",
            "--metrics-addr",
            f"127.0.0.1:{port}",
            "--log-format",
            "json",
        )
    assert result.returncode == 2
    assert f"port {port} is already in use" in result.stderr
    assert "Traceback" not in result.stderr


def test_help_everywhere():
    for args in (["--help"], ["demo", "--help"], ["capacity", "--help"]):
        result = run(*args)
        assert result.returncode == 0 and "usage: kvobs" in result.stdout
    assert "KVOBS_METRICS_ADDR" in run("demo", "--help").stdout


def test_library_and_exporter_work_without_torch():
    code = (
        "import sys; sys.modules['torch'] = None\n"  # any `import torch` now fails
        "import structlog, kvobs, kvobs.exporter, kvobs.cli\n"
        "from kvobs.recorder import Recorder\n"
        "t = kvobs.exporter.Telemetry.start(Recorder(), structlog.get_logger(),"
        " metrics_addr='127.0.0.1:0', summary_interval_s=0)\n"
        "t.close(); print('ok')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith("ok")
