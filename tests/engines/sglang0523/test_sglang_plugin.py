"""The ``sglang.srt.plugins`` entry point, loaded by SGLang's own plugin loader.

kvobs is enabled only through ``sglang.srt.plugins.load_plugins()`` with
``KVOBS_ENABLE=1``: the entry point comes from kvobs's installed metadata
(``SGLANG_PLUGINS=kvobs`` leaves this venv's other plugins out) and SGLang's
``HookRegistry`` applies kvobs's ``AFTER`` hook to ``Scheduler.__init__``.

No SGLang server runs on CPU (no CPU ``sgl-kernel``), so the scheduler is built with a
stand-in for the body of ``Scheduler.__init__``: it sets what the real one sets and the
hook reads (``server_args``, ``model_config``, ``enable_hierarchical_cache``,
``token_to_kv_pool_allocator``, ``tree_cache``; see ``Scheduler.__init__`` and
``init_model_config`` in scheduler.py) from the real KV stack of ``scheduler_loop``
(``UnifiedRadixCache`` + ``init_hicache``). ``Scheduler(server_args, port_args)`` then
runs SGLang's own wrapper, which calls the hook after that body, as in a scheduler
process. The loop's steps run on the same objects and every kvobs figure is read back by
scraping the plugin's ``/metrics`` over HTTP:

==============================  ====================================================
kvobs series (scraped)          SGLang's own figure
==============================  ====================================================
``kvobs_lookups_total``         requests its ``PrefillAdder`` admitted
``kvobs_lookup_tokens_total``   ``log_hit_tokens + log_input_tokens``; ``gpu_hit`` /
                                ``host_hit`` = ``log_{device,host}_hit_tokens`` and
                                each ``Req.cached_tokens_{device,host}``
GPU capacity evictions          ``sglang:evicted_tokens_total`` / page
gpu->host, host->gpu blocks     ``sglang:hicache_backup_tokens_total``,
and bytes                       ``sglang:load_back_tokens_total`` / page, their
                                ``_bytes_total``
labels, port                    the ranks in SGLang's parallel context
==============================  ====================================================
"""

from __future__ import annotations

import logging
import socket
from collections import defaultdict
from types import SimpleNamespace
from typing import Any

import pytest
import sglang.srt.plugins
import structlog.testing
from sglang.srt.managers.scheduler import Scheduler
from sglang.srt.plugins.hook_registry import HookRegistry, HookSource, HookType
from sglang.srt.runtime_context import get_parallel, get_server_args

from kvobs.adapters._hooks import MARKER
from kvobs.adapters.sglang import plugin
from kvobs.testing import Conformance
from kvobs.top.scrape import fetch
from tests.engines.sglang0523.scheduler_loop import Engine
from tests.engines.sglang0523.test_scheduler_loop import host_hit_workload

PAGE = 16
#: The ranks of the scheduler built end to end: TP rank 1 of 2 in data-parallel replica 1.
RANKS = {"tp_rank": 1, "tp_size": 2, "attn_tp_rank": 1, "attn_tp_size": 2, "moe_tp_size": 2,
         "dp_rank": 1}
PORT_OFFSET = (1 * 1 + 0) * 2 + 1     # (dp * pp_size + pp) * tp_size + tp


@pytest.fixture
def loader(monkeypatch):
    """SGLang's plugin loader and hook registry as a fresh scheduler process has them;
    ``Scheduler.__init__`` is restored afterwards."""
    monkeypatch.setattr(sglang.srt.plugins, "_plugins_loaded", False)
    monkeypatch.setattr(HookRegistry, "_hooks", defaultdict(list))
    monkeypatch.setattr(HookRegistry, "_patched", set())
    monkeypatch.setattr(Scheduler, "__init__", Scheduler.__init__)
    monkeypatch.setenv("SGLANG_PLUGINS", "kvobs")
    monkeypatch.setenv("KVOBS_METRICS_ADDR", "127.0.0.1:0")
    monkeypatch.setenv("KVOBS_SUMMARY_INTERVAL_S", "0")
    monkeypatch.delenv("KVOBS_MODEL", raising=False)
    yield monkeypatch
    plugin.disable()


def stand_in_init(engine: Engine, tree_cache: Any = None) -> Any:
    """A body for ``Scheduler.__init__`` setting, from ``engine``'s real KV stack, what
    the real one sets and the hook reads."""
    def __init__(self: Any, server_args: Any, port_args: Any) -> None:
        self.server_args = server_args                              # Parse args
        self.model_config = SimpleNamespace(context_len=engine.context,  # init_model_config
                                            model_path=server_args.model_path)
        self.enable_hierarchical_cache = server_args.enable_hierarchical_cache
        self.token_to_kv_pool_allocator = engine.allocator           # build_kv_cache
        self.tree_cache = engine.tree if tree_cache is None else tree_cache
    return __init__


def load(loader: pytest.MonkeyPatch, engine: Engine, tree_cache: Any = None) -> None:
    """``KVOBS_ENABLE=1``, then SGLang's ``load_plugins()`` over the stand-in body."""
    loader.setenv("KVOBS_ENABLE", "1")
    loader.setattr(Scheduler, "__init__", stand_in_init(engine, tree_cache))
    sglang.srt.plugins.load_plugins()


def build_scheduler(**ranks: int) -> Scheduler:
    """``Scheduler(server_args, port_args)`` in a process of the given ranks."""
    with get_parallel().override(**ranks):
        return Scheduler(get_server_args(), None)


def warnings(logs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [log for log in logs if log["log_level"] in ("warning", "error")]


def test_load_plugins_applies_kvobs_hook_to_scheduler_init(loader, caplog):
    original = Scheduler.__init__
    loader.setenv("KVOBS_ENABLE", "1")
    with caplog.at_level(logging.INFO, logger="sglang.srt.plugins"):
        sglang.srt.plugins.load_plugins()
    assert "Executed general plugin: kvobs" in caplog.messages
    assert HookRegistry._hooks[plugin.TARGET] == [
        (HookType.AFTER, plugin.after_scheduler_init, HookSource("kvobs", "kvobs"))]
    assert plugin.TARGET in HookRegistry._patched
    assert Scheduler.__init__ is not original and Scheduler.__init__.__wrapped__ is original


def test_without_kvobs_enable_nothing_is_registered(loader):
    original = Scheduler.__init__
    loader.delenv("KVOBS_ENABLE", raising=False)
    sglang.srt.plugins.load_plugins()
    assert plugin.TARGET not in HookRegistry._hooks
    assert Scheduler.__init__ is original


def test_the_plugins_endpoint_serves_sglangs_own_figures(stand_ins, loader):
    engine = Engine(tokens=256, host_ratio=4.0)
    with socket.socket() as probe:                        # a free port for this rank
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    loader.setenv("KVOBS_METRICS_ADDR", f"127.0.0.1:{port - PORT_OFFSET}")
    load(loader, engine)
    with structlog.testing.capture_logs() as logs:
        scheduler = build_scheduler(**RANKS)
    state = plugin.state()
    assert scheduler.tree_cache is engine.tree and hasattr(engine.tree, MARKER)
    assert hasattr(engine.controller, MARKER), "the hierarchical cache is instrumented"
    assert state.telemetry.metrics_url == f"http://127.0.0.1:{port}/metrics"
    enabled = [log for log in logs if log["event"] == "kvobs_enabled"]
    assert enabled and enabled[0]["metrics_url"] == state.telemetry.metrics_url
    capacity = [log for log in logs if log["event"] == "kv_cache_capacity"]
    assert len(capacity) == 1 and capacity[0]["tp_rank"] == "1", "after instrumenting"
    gpu, host = capacity[0]["tiers"]["gpu"], capacity[0]["tiers"]["host"]
    kv_bytes = engine.allocator.get_kvcache().mem_usage * 1024**3  # SGLang's KV Cache size
    assert gpu["bytes"] > 0  # the usable pages: SGLang's buffers hold one padding page more
    assert gpu["bytes"] == pytest.approx(kv_bytes * 256 / (256 + PAGE), rel=1e-9)
    assert host["bytes"] == engine.host_pool.size * engine.host_pool.size_per_token > 0
    assert not warnings(logs)

    host_hit_workload(engine, Conformance(state.recorder, truth=engine.truth,
                                          stores_match_transfers=False))
    scrape = fetch(state.telemetry.metrics_url)
    assert scrape.ok, scrape.error
    ranks = {"engine": "sglang", "model": "dummy", "tp_rank": "1", "dp_rank": "1"}
    tokens = scrape.by("kvobs_lookup_tokens_total", "outcome", **ranks)
    assert scrape.total("kvobs_lookups_total", **ranks) == len(engine.admitted) == 16
    assert sum(tokens.values()) == engine.prompt_tokens
    assert tokens[("gpu_hit",)] == engine.device_hit_tokens == \
        sum(r.cached_tokens_device for r in engine.admitted) > 0
    assert tokens[("host_hit",)] == engine.host_hit_tokens == \
        sum(r.cached_tokens_host for r in engine.admitted) > 0
    evicted = scrape.total("kvobs_block_evictions_total", tier="gpu", reason="capacity", **ranks)
    assert evicted * PAGE == engine.metric("sglang:evicted_tokens_total") > 0
    for src, dst, sglang_name in (("gpu", "host", "sglang:hicache_backup"),
                                  ("host", "gpu", "sglang:load_back")):
        link = {"src_tier": src, "dst_tier": dst, **ranks}
        assert scrape.total("kvobs_transfer_blocks_total", **link) * PAGE == \
            engine.metric(f"{sglang_name}_tokens_total", pool="kv") > 0
        assert scrape.total("kvobs_transfer_bytes_total", **link) == \
            engine.metric(f"{sglang_name}_bytes_total")
    assert scrape.total("kvobs_instrumentation_errors_total") == 0


def test_a_tree_cache_of_unknown_type_is_logged_once_and_sglang_goes_on(stand_ins, loader):
    engine = Engine(tokens=256, host_ratio=4.0)
    load(loader, engine, tree_cache=SimpleNamespace(cache_controller=None))
    with structlog.testing.capture_logs() as logs:
        scheduler = build_scheduler()
    assert isinstance(scheduler, Scheduler)
    failed = warnings(logs)
    assert [log["event"] for log in failed] == ["kvobs_instrument_failed"]
    assert "SimpleNamespace" in failed[0]["error"]
    assert failed[0]["effect"] == "SGLang runs uninstrumented"
    assert plugin.state().recorder is None and plugin.state().telemetry is None
    assert not hasattr(engine.allocator, MARKER), "nothing is left wrapped"
    engine.submit(list(range(300, 360)))
    assert engine.run() > 0 and len(engine.finished) == 1


def test_a_taken_port_moves_up_and_a_bad_address_is_said_and_ignored(stand_ins, loader):
    engine = Engine(tokens=256, host_ratio=4.0)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        loader.setenv("KVOBS_METRICS_ADDR", f"127.0.0.1:{port}")
        load(loader, engine)
        with structlog.testing.capture_logs() as logs:
            build_scheduler()
        served = plugin.state().telemetry.metrics_url
    assert served != f"http://127.0.0.1:{port}/metrics" and fetch(served).ok
    assert not warnings(logs)
    plugin.disable()

    # A bad value never disables kvobs: one warning names it and the default it uses.
    loader.setenv("KVOBS_METRICS_ADDR", "127.0.0.1:notaport")
    with structlog.testing.capture_logs() as logs:
        build_scheduler()
    said = warnings(logs)
    assert [log["event"] for log in said] == ["kvobs_setting_ignored"]
    assert said[0]["variable"] == "KVOBS_METRICS_ADDR" and said[0]["using"] == "127.0.0.1:9464"
    assert plugin.state().recorder is not None and hasattr(engine.allocator, MARKER)
    assert fetch(plugin.state().telemetry.metrics_url).ok
    plugin.disable()


def test_a_host_tier_kvobs_cannot_instrument_leaves_the_gpu_tier(stand_ins, loader):
    engine = Engine(tokens=256, host_ratio=4.0)
    engine.tree.cache_controller = SimpleNamespace()   # not a HiCacheController
    try:
        load(loader, engine)
        with structlog.testing.capture_logs() as logs:
            build_scheduler()
    finally:
        engine.tree.cache_controller = engine.controller
    partial = warnings(logs)
    assert [log["event"] for log in partial] == ["kvobs_instrument_partial"]
    assert partial[0]["missing"] == "host tier"
    assert plugin.state().recorder.tier_names == ("gpu",)
    assert fetch(plugin.state().telemetry.metrics_url).ok


def test_a_failing_registration_never_reaches_sglang(loader, caplog):
    def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("registry changed")

    loader.setattr(HookRegistry, "register", broken)
    loader.setenv("KVOBS_ENABLE", "1")
    with structlog.testing.capture_logs() as logs, \
            caplog.at_level(logging.INFO, logger="sglang.srt.plugins"):
        sglang.srt.plugins.load_plugins()
    assert "Executed general plugin: kvobs" in caplog.messages, "SGLang saw no exception"
    failed = warnings(logs)
    assert [log["event"] for log in failed] == ["kvobs_enable_failed"]
    assert "registry changed" in failed[0]["error"]
    assert plugin.TARGET not in HookRegistry._hooks
