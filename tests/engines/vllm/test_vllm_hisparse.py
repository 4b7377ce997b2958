"""kvobs on vLLM HiSparse: a real 0.33 ``Scheduler`` with the real ``HiSparseConnector``
(see hisparse_engine), its host pool a primary host tier.

Truth is vLLM's: its KV cache capacity (``update_kv_cache_capacity``, the "GPU + host
KV cache size" figures), the host pool's usage as vLLM computes it (``get_usage``, what
``vllm:hisparse_host_cache_usage_perc`` exports), the host pool's KV events (medium
``CPU``), the page transfers vLLM planned and completed, the scheduler stats'
``kv_connector_stats`` (what ``vllm:hisparse_*`` counts) and its prefix-cache stats.
"""

from __future__ import annotations

import logging
import random
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import structlog
import vllm.plugins
from prometheus_client.parser import text_string_to_metric_families
from structlog.testing import capture_logs
from vllm.v1.core.kv_cache_utils import get_kv_cache_capacity

from kvobs.adapters.vllm import instrument_scheduler, plugin
from kvobs.adapters.vllm.capacity import gpu_tier_capacity
from kvobs.adapters.vllm.manager import VllmInstrumentation
from kvobs.capacity import CapacityPlan
from kvobs.recorder import Recorder
from tests.engines.vllm.hisparse_engine import (
    BLOCK,
    HiSparseDriver,
    build_hisparse_scheduler,
    page_bytes,
)
from tests.engines.vllm.vllm_engine import SCHEDULING

MAX_MODEL_LEN = 1024


def instrumented(tmp_path: Path, **kwargs: Any) -> tuple[Any, Recorder, VllmInstrumentation]:
    scheduler = build_hisparse_scheduler(tmp_path, **kwargs)
    rec = Recorder(engine="vllm", model="dsv32")
    return scheduler, rec, instrument_scheduler(scheduler, rec)


def chats(driver: HiSparseDriver, count: int = 11, max_tokens: int = 12) -> None:
    """Requests sharing a 64-token system prompt, prompts of 200 to 500 tokens."""
    for i in range(count):
        driver.add(f"r{i}", [i % 3] * BLOCK + list(range(100 + i, 300 + 31 * i)),
                   max_tokens=max_tokens)


def test_capacity_is_vllms_and_the_host_pool_bounds_concurrency(tmp_path):
    scheduler, rec, inst = instrumented(tmp_path, gpu_blocks=150, host_blocks=29)
    assert inst.active
    config, vllm_config = scheduler.kv_cache_config, scheduler.vllm_config
    host, gpu = rec.tier("host"), rec.tier("gpu")
    # vLLM's host pool: hisparse_host_num_blocks blocks, one of them the null block
    assert (host.capacity_blocks, host.block_tokens) == (29 - 1, BLOCK)
    assert host.block_bytes == config.hisparse_host_block_stride == page_bytes()
    host_tensor = sum(t.size for t in config.kv_cache_tensors if t.host_resident)
    assert (host.capacity_blocks + 1) * host.block_bytes == host_tensor  # vLLM's host bytes
    # the GPU tier is the device pool alone: its bytes are the device tensors', not the host's
    device_tensor = max(t.size for t in config.kv_cache_tensors if not t.host_resident)
    assert (gpu.capacity_blocks + 1) * gpu.block_bytes == device_tensor
    assert gpu_tier_capacity(config).block_bytes == device_tensor // config.num_blocks
    # vLLM: "GPU + host KV cache size: N tokens": the smaller of the two pools' limits
    tokens, concurrency = get_kv_cache_capacity(vllm_config, config)
    plan = CapacityPlan.from_recorder(rec, request_tokens=MAX_MODEL_LEN)
    assert plan.bounded_by == "host" and host.role == "primary"
    pages = MAX_MODEL_LEN // BLOCK
    assert concurrency == 29 / pages  # vLLM counts the null block; kvobs does not
    assert plan.max_concurrency == pytest.approx(concurrency * 28 / 29)
    assert plan.max_concurrency * MAX_MODEL_LEN == pytest.approx(tokens * 28 / 29, abs=1)
    assert plan.concurrency("gpu") > plan.max_concurrency
    event = plan.as_event()
    assert event["tiers"]["host"]["role"] == "primary" and event["bounded_by"] == "host"


def test_a_large_host_pool_leaves_the_gpu_bounding_as_vllm_says(tmp_path):
    scheduler, rec, _ = instrumented(tmp_path, gpu_blocks=60, host_blocks=200)
    _, concurrency = get_kv_cache_capacity(scheduler.vllm_config, scheduler.kv_cache_config)
    plan = CapacityPlan.from_recorder(rec, request_tokens=MAX_MODEL_LEN)
    assert plan.bounded_by == "gpu"
    assert plan.max_concurrency == pytest.approx(concurrency * 59 / 60)  # null block


@SCHEDULING
def test_host_pool_fills_requests_wait_and_every_step_equals_vllm(tmp_path, async_scheduling):
    scheduler, rec, _ = instrumented(tmp_path, gpu_blocks=150, host_blocks=29,
                                     async_scheduling=async_scheduling)
    driver = HiSparseDriver(scheduler, transfer_delay=1)
    assert driver.batch_queue_size == (2 if async_scheduling else 1)
    chats(driver)
    host_was_full = False
    while driver.busy and driver.steps < 300:
        driver.step()
        snap = rec.snapshot().tier("host")
        assert (snap.in_use_blocks, snap.cached_blocks) == driver.host_state()
        host_was_full |= snap.in_use_blocks == snap.capacity_blocks
    assert not driver.busy
    truth, snap = driver.truth, rec.snapshot()
    assert host_was_full and truth.waiting_with_host_full > 0  # admission waited
    writeback = snap.link("gpu", "host")
    assert truth.writebacks > 0
    assert (writeback.operations, writeback.blocks) == (truth.writebacks, truth.writebacks)
    assert writeback.bytes == truth.writebacks * page_bytes()
    assert writeback.seconds == 0.0  # the workers report no transfer times
    host = snap.tier("host")
    stored, removed = driver.host_events()
    assert host.stores == truth.writebacks == stored
    assert host.evictions["capacity"] == removed > 0
    assert host.in_use_blocks == 0 and host.cached_blocks == stored - removed
    # hot buffers: what vLLM's scheduler stats carried (vllm:hisparse_cache_*)
    series = rec.sources[0]()
    assert series["kvobs_hot_buffer_lookups_total"] == [({"outcome": "hit"}, truth.hot_hits),
                                                        ({"outcome": "miss"}, truth.hot_misses)]
    assert series["kvobs_hot_buffer_load_bytes_total"] == [({}, truth.hot_bytes)]
    assert truth.hot_misses > 0
    # lookups as vLLM's PrefixCacheStats count them, host-published prefixes hit
    assert (snap.lookups.tokens, snap.lookups.gpu_hit + snap.lookups.host_hit) == \
        (truth.prefix_queries, truth.prefix_hits)
    assert truth.prefix_hits > 0
    assert truth.pending_transfers == 0 and not snap.errors


@SCHEDULING
def test_prefix_hits_split_as_vllm_reads_them(tmp_path, async_scheduling):
    """A small GPU pool reuses the GPU copies of published pages while the host pool keeps
    them: vLLM reads those hit pages from the host (null in the resident row after its
    ``schedule()``) and the others from their GPU copies; kvobs's host / GPU hits are
    those tokens, and their sum is vLLM's PrefixCacheStats hits."""
    scheduler, rec, _ = instrumented(tmp_path, gpu_blocks=60, host_blocks=120,
                                     async_scheduling=async_scheduling)
    driver = HiSparseDriver(scheduler)
    rng = random.Random(0)
    systems = [[1000 * k + i for i in range(6 * BLOCK)] for k in range(4)]
    for i in range(24):
        suffix = [50000 + 100 * i + j for j in range(rng.randrange(20, 200))]
        driver.add(f"r{i}", systems[rng.randrange(4)] + suffix, max_tokens=8)
        for _ in range(3):
            if driver.busy:
                driver.step()
    driver.run()
    truth, lookups = driver.truth, rec.snapshot().lookups
    assert truth.host_served_hits > 0 and truth.gpu_served_hits > 0
    assert truth.mixed_hits > 0  # requests with some hit pages on GPU copies, some on host
    assert (lookups.gpu_hit, lookups.host_hit) == (truth.gpu_served_hits,
                                                   truth.host_served_hits)
    assert (lookups.tokens, lookups.gpu_hit + lookups.host_hit) == \
        (truth.prefix_queries, truth.prefix_hits)
    assert not rec.snapshot().errors


def test_restores_count_one_page_per_tp_rank(tmp_path):
    """A restore, as vLLM plans it when an import into the host pool completes (the
    import itself needs NixlConnector on GPUs: the test calls the coordinator's
    ``complete_host_import`` as its ``finish_host_import`` does), moves the page into
    every TP rank's GPU."""
    scheduler, rec, _ = instrumented(tmp_path, gpu_blocks=150, host_blocks=29,
                                     tensor_parallel_size=2)
    driver = HiSparseDriver(scheduler, transfer_delay=1, workers=2)
    driver.add("imported", list(range(5000, 5200)), max_tokens=30)
    for _ in range(6):
        driver.step()
    request = scheduler.requests["imported"]
    driver.coordinator.complete_host_import("imported", request.num_computed_tokens)
    restoring = [t for t, spill in driver.coordinator.pending_spills.items() if spill.restore]
    assert len(restoring) == 1
    driver.run()
    restore = rec.snapshot().link("host", "gpu")
    assert driver.truth.restores == 1
    assert (restore.operations, restore.blocks, restore.bytes) == (1, 1, 2 * page_bytes())
    writeback = rec.snapshot().link("gpu", "host")
    # no shared host pool off CUDA: each rank writes its own copy back
    assert writeback.bytes == driver.truth.writebacks * 2 * page_bytes()


def test_delayed_workers_complete_a_transfer_once(tmp_path):
    scheduler, rec, _ = instrumented(tmp_path, gpu_blocks=150, host_blocks=40)
    driver = HiSparseDriver(scheduler, transfer_delay=3, workers=2)
    chats(driver, count=6)
    driver.run()
    writeback = rec.snapshot().link("gpu", "host")
    assert writeback.operations == driver.truth.writebacks == driver.host_events()[0] > 0


def test_a_hisparse_kvobs_cannot_read_leaves_the_gpu_tier_instrumented(tmp_path):
    scheduler = build_hisparse_scheduler(tmp_path)
    coordinator = scheduler.connector.connector_scheduler.coordinator
    del coordinator.pending_spills  # a vLLM whose coordinator keeps its transfers elsewhere
    rec = Recorder(engine="vllm")
    with capture_logs() as logs:
        inst = instrument_scheduler(scheduler, rec)
    spills = inst.part("vllm.hisparse")
    assert spills is not None and not spills.active
    assert inst.part("vllm.block_pool").active and inst.part("vllm.hisparse_stats").active
    warning = next(e for e in logs if e["event"] == "kvobs_adapter_unsupported_version")
    assert "pending_spills" in str(warning)
    assert "host" in rec.tier_names  # the pool is read, only the transfers are not


def test_a_request_size_kvobs_cannot_read_is_counted_and_the_log_goes_by_tokens(tmp_path):
    scheduler = build_hisparse_scheduler(tmp_path, gpu_blocks=150, host_blocks=29)
    spec = scheduler.kv_cache_config.kv_cache_groups[0].kv_cache_spec

    def unreadable(vllm_config: Any) -> int:  # a vLLM whose spec sizes requests otherwise
        raise TypeError("max_memory_usage_bytes() takes a different argument")

    object.__setattr__(spec, "max_memory_usage_bytes", unreadable)  # a frozen dataclass
    rec = Recorder(engine="vllm", model="dsv32")
    with capture_logs() as logs:
        inst = instrument_scheduler(scheduler, rec)
    assert inst.part("vllm.hisparse").active  # the host pool and its transfers are counted
    assert rec.snapshot().errors == {"vllm.hisparse": 1}
    assert any(e["event"] == "instrumentation_error" and e["component"] == "vllm.hisparse"
               for e in logs)
    host, gpu = rec.tier("host"), rec.tier("gpu")
    assert (host.request_blocks, gpu.request_blocks) == (0, 0)
    plan = CapacityPlan.from_recorder(rec, request_tokens=MAX_MODEL_LEN)
    pages = MAX_MODEL_LEN // BLOCK  # by tokens: a request of max_model_len fills its pages
    assert plan.max_concurrency == pytest.approx(min(host.capacity_blocks,
                                                     gpu.capacity_blocks) / pages)


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return {(s.name, tuple(sorted((k, v) for k, v in s.labels.items()
                                  if k not in ("engine", "model")))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_zero_code_plugin_serves_the_host_tier_and_logs_vllms_semantics(monkeypatch, tmp_path,
                                                                         caplog):
    monkeypatch.setenv("KVOBS_ENABLE", "1")
    monkeypatch.setenv("KVOBS_METRICS_ADDR", "127.0.0.1:0")
    monkeypatch.setenv("KVOBS_SUMMARY_INTERVAL_S", "0")
    monkeypatch.setattr(vllm.plugins, "plugins_loaded", False)
    caplog.set_level(logging.INFO, logger="vllm.kvobs")
    with structlog.testing.capture_logs() as logs:
        vllm.plugins.load_general_plugins()
        try:
            scheduler = build_hisparse_scheduler(tmp_path, gpu_blocks=150, host_blocks=29)
            driver = HiSparseDriver(scheduler)
            chats(driver, count=6)
            driver.run()
            samples = scrape(plugin.state().telemetry.metrics_url)
        finally:
            plugin.disable()
    event = next(e for e in logs if e["event"] == "kv_cache_capacity")
    assert event["bounded_by"] == "host" and event["tiers"]["host"]["role"] == "primary"
    assert "host" in event["note"] and "bounds concurrency" in event["note"]
    line = next(r.getMessage() for r in caplog.records if r.name == "vllm.kvobs")
    assert "bounded by the host tier" in line and "primary store" in line
    assert samples[("kvobs_tier_capacity_blocks", (("dp_rank", "0"), ("tier", "host")))] == 28
    assert samples[("kvobs_transfer_blocks_total", (("dp_rank", "0"), ("dst_tier", "host"),
                                                    ("src_tier", "gpu")))] \
        == driver.truth.writebacks > 0
    assert samples[("kvobs_hot_buffer_lookups_total", (("dp_rank", "0"),
                                                       ("outcome", "miss")))] \
        == driver.truth.hot_misses
    assert samples[("kvobs_hot_buffer_load_bytes_total", (("dp_rank", "0"),))] \
        == driver.truth.hot_bytes


def test_without_the_adoption_hook_hits_stay_unsplit_with_one_warning(tmp_path, monkeypatch):
    from vllm.v1.hisparse.coordinator import HiSparseCoordinator

    scheduler = build_hisparse_scheduler(tmp_path)
    monkeypatch.delattr(HiSparseCoordinator, "_adopt_copies")  # a vLLM that renamed it
    rec = Recorder(engine="vllm")
    with capture_logs() as logs:
        inst = instrument_scheduler(scheduler, rec)
    assert inst.part("vllm.hisparse").active  # transfers still counted
    assert inst.part("vllm.kv_cache_manager").external is None  # lookups recorded at once
    warning = next(e for e in logs if e["event"] == "kvobs_instrument_partial")
    assert warning["missing"] == "HiSparseCoordinator._adopt_copies"
