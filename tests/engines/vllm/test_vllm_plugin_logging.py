"""The vLLM plugin in a fresh vLLM process: kvobs's events go through vLLM's own logging
(its handler, its format, under ``kvobs.vllm``), structlog is never configured, and a
typo in a ``KVOBS_*`` variable is one warning there while the scheduler is still
instrumented and served."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]

ENGINE = textwrap.dedent("""
    import sys, tempfile, urllib.request
    from pathlib import Path
    import structlog
    import vllm.plugins
    from vllm.config.logging import LoggingConfig
    from vllm.logger import configure_logging
    from tests.engines.vllm.vllm_engine import build_scheduler
    from kvobs.adapters.vllm import plugin
    configure_logging(LoggingConfig())  # what vLLM's engine core does first
    vllm.plugins.load_general_plugins()
    scheduler = build_scheduler(Path(tempfile.mkdtemp()), gpu_blocks=32, cpu_bytes=1 << 20)
    state = plugin.state()
    body = urllib.request.urlopen(state.telemetry.metrics_url, timeout=10).read().decode()
    print("RESULT", state.schedulers, "kvobs_tier_capacity_blocks{" in body,
          structlog.is_configured(), flush=True)
    plugin.disable()
""")


def run(**env: str) -> tuple[list[str], str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("KVOBS_")}
    base.update(KVOBS_ENABLE="1", KVOBS_METRICS_ADDR="127.0.0.1:0", HF_HUB_OFFLINE="1",
                VLLM_LOGGING_LEVEL="INFO", VLLM_LOGGING_STREAM="ext://sys.stdout",
                NO_COLOR="1", **env)
    result = subprocess.run([sys.executable, "-c", ENGINE], capture_output=True, text=True,
                            env=base, cwd=REPO, timeout=300, check=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout.splitlines(), result.stderr


def kvobs_lines(lines: list[str]) -> list[str]:
    return [line for line in lines if "kvobs_" in line and not line.startswith("RESULT")]


def test_events_in_vllms_log_and_a_typo_is_one_warning() -> None:
    lines, stderr = run(KVOBS_SUMMARY_INTERVAL_S="6O")
    assert lines[-1] == "RESULT 1 True False"  # instrumented, served, structlog untouched
    ours = kvobs_lines(lines)
    # vLLM's format: "LEVEL MM-DD HH:MM:SS [file.py:line] message"
    warning = [line for line in ours if "kvobs_setting_ignored" in line]
    assert len(warning) == 1 and re.search(r"\bWARNING \d\d-\d\d ", warning[0]), ours
    assert "variable=KVOBS_SUMMARY_INTERVAL_S value=6O" in warning[0]
    assert "using=60.0" in warning[0]
    enabled = [line for line in ours if "] kvobs_enabled " in line]
    assert enabled and re.search(r"\bINFO \d\d-\d\d ", enabled[0]), ours
    assert "metrics_url=http://" in enabled[0]
    assert "kvobs_enabled" not in stderr and "Traceback" not in stderr


def test_log_format_json_makes_each_message_a_json_object() -> None:
    lines, _ = run(KVOBS_LOG_FORMAT="json")
    events = [json.loads(line[line.index('] {"event"') + 2:]) for line in lines
              if '] {"event"' in line]
    names = {e["event"] for e in events}
    assert {"kv_cache_capacity", "metrics_serving", "kvobs_enabled"} <= names, lines[-20:]
