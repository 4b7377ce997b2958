"""The vllm.general_plugins entry point, loaded by vLLM's own plugin loader.

A full vLLM Scheduler needs a model config (model registry inspection) that does not
build on this CPU-only venv, so the scheduler here is a real ``Scheduler`` instance whose
constructor is skipped, holding a real KVCacheManager: the hook, the instrumentation,
the endpoint and the scrape are all real.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import urllib.request

import pytest
from vllm.v1.core.sched.scheduler import Scheduler
from vllm_objects import admit, kv_cache_manager, request

from kvobs.adapters.vllm import plugin


@pytest.fixture
def enabled():
    state = plugin.enable()
    yield state
    plugin.disable()


def run_loader(env: dict[str, str]) -> str:
    """Run vLLM's plugin loader in a fresh interpreter; print whether the hook is on."""
    code = textwrap.dedent("""
        from vllm.plugins import load_general_plugins
        from vllm.v1.core.sched.scheduler import Scheduler
        load_general_plugins()
        print("hooked" if getattr(Scheduler.__init__, "_kvobs_scheduler_hook", False)
              else "not hooked")
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env=env, timeout=120, check=True)
    return result.stdout.strip().splitlines()[-1]


def test_vllm_loader_finds_the_entry_point_and_hooks_with_kvobs_enable():
    base = {k: v for k, v in os.environ.items() if not k.startswith("KVOBS_")}
    assert run_loader({**base, "KVOBS_ENABLE": "1"}) == "hooked"


def test_new_scheduler_is_instrumented_and_served(enabled, monkeypatch):
    monkeypatch.setenv("KVOBS_METRICS_ADDR", "127.0.0.1:0")
    monkeypatch.setenv("KVOBS_MODEL", "tiny-llama")
    scheduler = Scheduler.__new__(Scheduler)
    scheduler.kv_cache_manager = kv_cache_manager(24)
    scheduler.connector = None
    inst = enabled.attach(scheduler)
    assert inst.active
    manager = scheduler.kv_cache_manager
    req = request(list(range(50)))
    admit(manager, req)

    body = urllib.request.urlopen(enabled.server.url, timeout=10).read().decode()
    assert 'kvobs_tier_capacity_blocks{engine="vllm",model="tiny-llama"' in body
    allocations = [line for line in body.splitlines()
                   if line.startswith("kvobs_block_allocations_total{") and 'tier="gpu"' in line]
    assert allocations and float(allocations[0].rsplit(" ", 1)[1]) == 4.0

    plugin.disable()
    assert not getattr(Scheduler.__init__, plugin.HOOK_FLAG, False)
    assert manager.block_pool.get_new_blocks.__func__ is type(manager.block_pool).get_new_blocks


def test_register_without_kvobs_enable_does_nothing(monkeypatch):
    monkeypatch.delenv("KVOBS_ENABLE", raising=False)
    plugin.register()
    assert not getattr(Scheduler.__init__, plugin.HOOK_FLAG, False)
