"""The vllm.general_plugins entry point, loaded by vLLM's own plugin loader, in a real loop.

kvobs is enabled only through ``vllm.plugins.load_general_plugins()`` with
``KVOBS_ENABLE=1``; the schedulers are real vLLM 0.33 ``Scheduler``s built on CPU by
``vllm_engine.build_scheduler`` (and, for the worker side, vLLM's worker-side
``OffloadingConnector`` over a CPU ``OffloadingWorker``, see ``test_vllm_tiering``).
Every figure is read back by scraping ``/metrics`` over HTTP.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from importlib.metadata import version
from pathlib import Path

import pytest
import structlog
import vllm.plugins
from prometheus_client.parser import text_string_to_metric_families
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.worker import (
    OffloadingConnectorWorker,
)
from vllm.v1.core.sched.scheduler import Scheduler

from kvobs.adapters.vllm import plugin
from tests.engines.vllm.test_vllm_tiering import (
    CpuCopyWorker,
    WorkerLoop,
    tiering_scheduler,
    worker_connector,
)
from tests.engines.vllm.vllm_engine import SCHEDULING, EngineDriver, build_scheduler


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """``{(sample name, sorted labels without engine/model): value}`` of one scrape."""
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = {k: v for k, v in sample.labels.items() if k not in ("engine", "model")}
            samples[(sample.name, tuple(sorted(labels.items())))] = sample.value
    return samples


def value(samples: dict, name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels``."""
    return sum(v for (n, got), v in samples.items()
               if n == name and all((k, want) in got for k, want in labels.items()))


@pytest.fixture
def loaded(monkeypatch):
    """kvobs enabled the way a user enables it: env vars and vLLM's plugin loader."""
    monkeypatch.setenv("KVOBS_ENABLE", "1")
    monkeypatch.setenv("KVOBS_METRICS_ADDR", "127.0.0.1:0")
    monkeypatch.setenv("KVOBS_MODEL", "tiny-llama")
    monkeypatch.setenv("KVOBS_SUMMARY_INTERVAL_S", "0")
    monkeypatch.setattr(vllm.plugins, "plugins_loaded", False)
    with structlog.testing.capture_logs() as logs:
        vllm.plugins.load_general_plugins()
        yield logs
    plugin.disable()


def run_loader(env: dict[str, str]) -> str:
    """Run vLLM's plugin loader in a fresh interpreter; print whether the hooks are on."""
    code = textwrap.dedent("""
        from vllm.plugins import load_general_plugins
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.distributed.kv_transfer.kv_connector.v1.offloading.worker import (
            OffloadingConnectorWorker)
        load_general_plugins()
        hooked = (getattr(Scheduler.__init__, "_kvobs_scheduler_hook", False),
                  getattr(OffloadingConnectorWorker.register_kv_caches,
                          "_kvobs_worker_hook", False))
        print("hooked" if all(hooked) else "not hooked" if not any(hooked) else "half")
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env=env, timeout=120, check=True)
    return result.stdout.strip().splitlines()[-1]


def test_vllm_loader_finds_the_entry_point_and_hooks_with_kvobs_enable():
    base = {k: v for k, v in os.environ.items() if not k.startswith("KVOBS_")}
    assert run_loader({**base, "KVOBS_ENABLE": "1"}) == "hooked"
    assert run_loader(base) == "not hooked"


@SCHEDULING
def test_real_scheduler_is_instrumented_served_and_unwrapped(loaded, tmp_path,
                                                             async_scheduling):
    """The plugin's hook in ``Scheduler.__init__`` instruments vLLM's ``AsyncScheduler``
    (async scheduling, a GPU engine's default) as it does the ``Scheduler``."""
    scheduler = build_scheduler(tmp_path, gpu_blocks=64, cpu_bytes=1 << 20,
                                async_scheduling=async_scheduling)
    assert (type(scheduler).__name__ == "AsyncScheduler") == async_scheduling
    state = plugin.state()
    assert state.schedulers == 1 and state.instrumentations[0].active
    url = state.telemetry.metrics_url
    assert url.startswith("http://127.0.0.1:")

    driver = EngineDriver(scheduler)
    for conv in range(4):
        driver.add(f"c{conv}", [conv * 1000 + i for i in range(100)], max_tokens=3)
    driver.run()
    driver.add("again", [i for i in range(100)], max_tokens=3)  # conversation 0 returns
    driver.run()

    samples = scrape(url)
    pool = scheduler.kv_cache_manager.block_pool
    assert value(samples, "kvobs_tier_capacity_blocks", tier="gpu", dp_rank="0") == \
        pool.num_gpu_blocks - 1
    host_chunks = driver.offloading_manager._num_chunks
    assert value(samples, "kvobs_tier_capacity_blocks", tier="host", dp_rank="0") == host_chunks
    assert value(samples, "kvobs_lookup_tokens_total", dp_rank="0") == driver.prefix_queries
    assert value(samples, "kvobs_lookup_tokens_total", outcome="gpu_hit") == driver.prefix_hits
    gpu_in_use, gpu_cached = driver.gpu_state()
    assert value(samples, "kvobs_tier_resident_blocks", tier="gpu", state="cached") == gpu_cached
    assert value(samples, "kvobs_tier_resident_blocks", tier="gpu", state="in_use") == gpu_in_use

    (capacity,) = [e for e in loaded if e["event"] == "kv_cache_capacity"]
    assert set(capacity["tiers"]) == {"gpu", "host"}
    assert capacity["tiers"]["gpu"]["blocks"] == pool.num_gpu_blocks - 1
    assert capacity["tiers"]["host"]["blocks"] == host_chunks
    assert capacity["dp_rank"] == "0" and capacity["model"] == "tiny-llama"
    serving = [e for e in loaded if e["event"] == "metrics_serving"]
    assert serving and serving[0]["url"] == url and serving[0]["dp_rank"] == "0"
    # the release named, as tested, and every part of the scheduler read (this release is
    # in the matrix): in the enable line and the info series
    release = version("vllm")
    (enabled,) = [e for e in loaded if e["event"] == "kvobs_instrumented"]
    assert (enabled["version"], enabled["support"]) == (release, "tested")
    assert enabled["parts"] == ("gpu_tier on; lookups on; host_tier on; step_timing on; "
                                "transfers on")
    assert value(samples, "kvobs_engine_info", engine_version=release, support="tested") == 1
    assert {dict(labels)["part"]: v for (name, labels), v in samples.items()
            if name == "kvobs_part_enabled"} == {
        "gpu_tier": 1, "lookups": 1, "host_tier": 1, "step_timing": 1, "transfers": 1}

    manager = driver.offloading_manager
    plugin.disable()
    assert not getattr(Scheduler.__init__, plugin.HOOK_FLAG, False)
    assert not getattr(OffloadingConnectorWorker.register_kv_caches, plugin.WORKER_HOOK_FLAG,
                       False)
    assert pool.get_new_blocks.__func__ is type(pool).get_new_blocks
    assert manager.prepare_store.__func__ is type(manager).prepare_store
    kv_manager = scheduler.kv_cache_manager
    assert kv_manager.record_prefix_cache_stats.__func__ is \
        type(kv_manager).record_prefix_cache_stats
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(url, timeout=2)
    assert plugin.state().recorder is None


def test_a_scheduler_with_tiering_exports_the_disk_tier(loaded, tmp_path):
    scheduler = tiering_scheduler(tmp_path)
    loop = WorkerLoop(scheduler, worker_connector(scheduler))
    try:
        for conv in range(6):
            loop.add(f"c{conv}", [1000 * (conv + 1) + i for i in range(49)], max_tokens=2)
            loop.run()
        samples = scrape(plugin.state().telemetry.metrics_url)
        files = sum(1 for _ in (tmp_path / "fs").rglob("*.bin"))
        assert files == 18
        assert value(samples, "kvobs_block_stores_total", tier="disk") == files
        assert value(samples, "kvobs_tier_resident_blocks", tier="disk", state="cached") == files
        assert value(samples, "kvobs_transfer_blocks_total", src_tier="host",
                     dst_tier="disk") == files
        assert value(samples, "kvobs_tier_capacity_blocks", tier="disk") > files
        (capacity,) = [e for e in loaded if e["event"] == "kv_cache_capacity"]
        assert "disk" in capacity["tiers"]
        # the worker shares this process: its device timings land on the counted links
        worker = loop.connector.connector_worker.worker
        assert isinstance(worker, CpuCopyWorker) and worker.submitted > 0
        assert value(samples, "kvobs_transfer_duration_seconds_count", src_tier="gpu",
                     dst_tier="host") > 0
        plugin.disable()
        manager = loop.offloading_manager
        assert manager.prepare_load.__func__ is type(manager).prepare_load
        tier = manager.secondary_tiers[0]
        assert tier.get_finished_jobs.__func__ is type(tier).get_finished_jobs
        assert worker.get_finished.__func__ is type(worker).get_finished
    finally:
        loop.offloading_manager.shutdown()


def worker_process(tmp_path):
    """An engine's scheduler, then, as in a worker process of its own (the multi-process
    executor's; the plugin loaded afresh), its worker-side connector."""
    engine = build_scheduler(tmp_path, gpu_blocks=64, cpu_bytes=1 << 20)
    plugin.disable()  # the scheduler above lives "in another process"
    vllm.plugins.plugins_loaded = False
    vllm.plugins.load_general_plugins()
    engine.vllm_config.parallel_config.distributed_executor_backend = "mp"
    return engine, worker_connector(engine)


def test_a_worker_process_serves_nothing_unless_asked(loaded, tmp_path):
    """By default a worker process of its own starts no telemetry and wraps nothing: the
    engine core's endpoint carries its transfers (vLLM sends it their times)."""
    _engine, connector = worker_process(tmp_path)
    state = plugin.state()
    assert state.recorder is None and state.telemetry is None and not state.instrumentations
    worker = connector.connector_worker.worker
    assert worker.get_finished.__func__ is type(worker).get_finished


def test_an_opted_in_worker_process_exports_shard_timings_with_its_ranks(loaded, tmp_path,
                                                                         monkeypatch):
    """``KVOBS_WORKER_METRICS=1``: a worker process (no scheduler in it) times every shard
    on timing-only links, as ``kvobs_transfer_shard_duration_seconds`` labelled dp_rank
    and tp_rank; no transfer counters and no engine-level duration histogram."""
    monkeypatch.setenv("KVOBS_WORKER_METRICS", "1")
    monkeypatch.setenv("KVOBS_SUMMARY_INTERVAL_S", "60")  # an engine's summary: not a worker's
    engine, connector = worker_process(tmp_path)
    state = plugin.state()
    assert state.schedulers == 0 and state.recorder.labels == {"dp_rank": "0", "tp_rank": "0"}
    assert state.telemetry.summary is None  # no tiers here: no empty kv_cache_summary
    driver = WorkerLoop(engine, connector)
    for conv in range(3):
        driver.add(f"c{conv}", [conv * 1000 + i for i in range(100)], max_tokens=3)
    driver.run()
    worker = connector.connector_worker.worker
    samples = scrape(state.telemetry.metrics_url)
    stores = value(samples, "kvobs_transfer_shard_duration_seconds_count", src_tier="gpu",
                   dst_tier="host", tp_rank="0", dp_rank="0")
    assert stores > 0 and stores == worker.submitted  # every job the worker ran, timed
    assert not [k for k in samples if k[0] in ("kvobs_transfer_operations_total",
                                                "kvobs_transfer_duration_seconds_count")]


def test_register_without_kvobs_enable_does_nothing(monkeypatch):
    monkeypatch.delenv("KVOBS_ENABLE", raising=False)
    plugin.register()
    assert not getattr(Scheduler.__init__, plugin.HOOK_FLAG, False)
    assert plugin.state().recorder is None


def test_a_failure_while_instrumenting_never_reaches_vllm(loaded, tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("kvobs bug")

    monkeypatch.setattr(plugin, "instrument_scheduler", broken)
    scheduler = build_scheduler(tmp_path, gpu_blocks=64, cpu_bytes=1 << 20)
    driver = EngineDriver(scheduler)
    driver.add("r", list(range(40)), max_tokens=2)
    driver.run()
    failed = [e for e in loaded if e["event"] == "kvobs_instrument_failed"]
    assert failed and "kvobs bug" in failed[0]["error"]
    assert plugin.state().recorder.snapshot().errors == {"vllm.plugin": 1}


# -- the worker adapter on its own ------------------------------------------------------
def _specs(gpu_ids, chunk_ids):
    from vllm.v1.kv_offload.base import GPULoadStoreSpec
    from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec

    return (GPULoadStoreSpec(gpu_ids, group_sizes=[len(gpu_ids)], block_indices=[0]),
            CPULoadStoreSpec(chunk_ids))


def _worker(timed: bool = True) -> CpuCopyWorker:
    import torch

    return CpuCopyWorker([torch.randn(16, 256).view(torch.int8)], num_chunks=8, timed=timed)


def test_worker_timings_go_to_timing_only_links():
    from kvobs.adapters.vllm import instrument_offloading_worker
    from kvobs.recorder import Recorder
    from kvobs.testing import capture_telemetry

    worker, rec = _worker(), Recorder()
    inst = instrument_offloading_worker(worker, rec)
    gpu, cpu = _specs([3, 4, 5], [0, 1, 2])
    assert worker.submit_store(1, gpu, cpu)
    gpu2, cpu2 = _specs([9, 10], [0, 1])
    assert worker.submit_load(2, cpu2, gpu2)
    results = {r.job_id: r for r in worker.get_finished()}
    out, back = rec.link("gpu", "host"), rec.link("host", "gpu")
    assert not out.counts and (out.operations, out.blocks) == (0, 0)
    assert out.drain_durations() == [results[1].transfer_time]
    assert back.drain_durations() == [results[2].transfer_time]
    with capture_telemetry(rec) as telemetry:
        out.timed(0.5)
        assert telemetry.value("kvobs_transfer_shard_duration_seconds", src_tier="gpu",
                               dst_tier="host") == 1
        assert "kvobs_transfer_operations_total" not in telemetry.collect()
    inst.unwrap()
    assert worker.get_finished.__func__ is CpuCopyWorker.get_finished


def test_worker_counting_links_and_the_wall_clock_fallback():
    from kvobs.adapters.vllm import instrument_offloading_worker
    from kvobs.recorder import Recorder

    worker, rec = _worker(timed=False), Recorder()
    instrument_offloading_worker(worker, rec, counts=True)
    gpu, cpu = _specs([3, 4, 5], [0, 1, 2])
    worker.submit_store(7, gpu, cpu)
    (result,) = worker.get_finished()
    assert result.transfer_time is None
    snap = rec.snapshot().link("gpu", "host")
    assert (snap.operations, snap.blocks, snap.bytes) == (1, 3, result.transfer_size)
    assert snap.seconds > 0  # timed from submission to get_finished
    worker.submit_load(8, *reversed(_specs([1], [0])))
    worker.done.clear()  # a job that never reports: nothing counted, nothing raised
    assert worker.get_finished() == []
    assert [(link.src, link.dst) for link in rec.links] == [("gpu", "host")]


def test_worker_adapter_refuses_other_objects():
    from kvobs.adapters._hooks import AdapterError
    from kvobs.adapters.vllm import instrument_offloading_worker
    from kvobs.recorder import Recorder

    with pytest.raises(AdapterError, match="OffloadingWorker"):
        instrument_offloading_worker([], Recorder())


def test_plugin_telemetry_pushes_otlp_and_logs_summaries(monkeypatch, tmp_path):
    """``Telemetry.start`` in the plugin: ``OTEL_EXPORTER_OTLP_ENDPOINT`` is honoured and
    the periodic ``kv_cache_summary`` event is logged, with the rank on both."""
    monkeypatch.syspath_prepend(str(Path(__file__).parents[2] / "telemetry"))
    from tests.telemetry.otlp_receiver import OtlpReceiver

    monkeypatch.setenv("KVOBS_ENABLE", "1")
    monkeypatch.setenv("KVOBS_METRICS_ADDR", "")
    monkeypatch.setenv("KVOBS_SUMMARY_INTERVAL_S", "0.1")
    monkeypatch.setattr(vllm.plugins, "plugins_loaded", False)
    with OtlpReceiver() as receiver, structlog.testing.capture_logs() as logs:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
        try:
            vllm.plugins.load_general_plugins()
            scheduler = build_scheduler(tmp_path, gpu_blocks=64, cpu_bytes=1 << 20)
            driver = EngineDriver(scheduler)
            driver.add("r", list(range(40)), max_tokens=2)
            driver.run()
            telemetry = plugin.state().telemetry
            assert telemetry.metrics_url is None  # KVOBS_METRICS_ADDR="" serves nothing
            telemetry.flush()
            assert receiver.received.wait(10)
            points = receiver.latest_points()
            for _ in range(50):
                if any(e["event"] == "kv_cache_summary" for e in logs):
                    break
                time.sleep(0.05)
        finally:
            plugin.disable()
    capacity = {a["tier"]: p.as_int for a, p in points["kvobs_tier_capacity_blocks"]}
    assert capacity == {"gpu": 63, "host": driver.offloading_manager._num_chunks}
    assert {a["dp_rank"] for a, _ in points["kvobs_tier_capacity_blocks"]} == {"0"}
    assert any(e["event"] == "kv_cache_summary" for e in logs)
    assert any(e["event"] == "otlp_pushing" for e in logs)


def test_single_process_executor_shares_one_endpoint_and_counted_links(loaded, tmp_path):
    """vLLM's ``uni`` executor: the worker registers its KV caches in the engine-core
    process before the scheduler exists, and is left alone; the engine core's one
    endpoint counts and times every transfer from what the worker sends it."""
    from vllm.v1.structured_output import StructuredOutputManager

    from tests.engines.vllm.vllm_engine import build_vllm_config, layer_specs, plan_kv_cache

    config = build_vllm_config(tmp_path, cpu_bytes=1 << 20, max_model_len=63 * 16)
    config.parallel_config.distributed_executor_backend = "uni"
    kv_config = plan_kv_cache(config, layer_specs(), 64)
    config.cache_config.num_gpu_blocks = 64
    connector = worker_connector(config=config, kv_config=kv_config)
    state = plugin.state()
    assert state.telemetry is None and not state.instrumentations  # the worker: not wrapped
    scheduler = Scheduler(config, kv_config, StructuredOutputManager(config), block_size=16,
                          log_stats=True)
    assert state.schedulers == 1
    driver = WorkerLoop(scheduler, connector)
    for conv in range(3):
        driver.add(f"c{conv}", [conv * 1000 + i for i in range(100)], max_tokens=3)
    driver.run()
    samples = scrape(state.telemetry.metrics_url)
    worker = connector.connector_worker.worker
    for link in ({"src_tier": "gpu", "dst_tier": "host"}, {"src_tier": "host", "dst_tier": "gpu"}):
        timed = value(samples, "kvobs_transfer_duration_seconds_count", **link)
        assert timed == value(samples, "kvobs_transfer_operations_total", **link)
        assert value(samples, "kvobs_transfer_duration_seconds_sum", **link) == \
            pytest.approx(value(samples, "kvobs_transfer_seconds_total", **link), rel=1e-9)
    stores = value(samples, "kvobs_transfer_duration_seconds_count", src_tier="gpu",
                   dst_tier="host")
    assert stores == worker.submitted > 0  # one sample per job the worker ran
    assert {dict(labels).get("tp_rank") for name, labels in samples  # the engine's labels
            if name.startswith("kvobs_")} == {None}


def test_a_release_whose_pool_changed_says_so_and_exports_no_made_up_gpu_tier(
        loaded, tmp_path, monkeypatch, caplog):
    """A newer vLLM whose block pool kvobs cannot read (stood in for by a field the GPU
    tier's check now asks for): the release is named untested, the GPU tier is off with
    its reason in the enable line, the capacity line names the GPU tier unreadable (never
    "max concurrency 0.00x"), and the GPU tier's series are absent, not 0."""
    from kvobs.adapters import versions
    from kvobs.adapters.vllm import block_pool

    monkeypatch.setattr(block_pool, "SPEC", dataclasses.replace(
        block_pool.SPEC, state=(*block_pool.SPEC.state, "null_block.block_hash_moved")))
    monkeypatch.setattr(versions, "installed", lambda engine: "0.35.0")
    with caplog.at_level("INFO", logger="vllm.kvobs"):
        scheduler = build_scheduler(tmp_path, gpu_blocks=64, cpu_bytes=1 << 20)
    (enabled,) = [e for e in loaded if e["event"] == "kvobs_instrumented"]
    assert (enabled["version"], enabled["support"]) == ("0.35.0", "untested")
    missing = "BlockPool.null_block.block_hash_moved is missing"
    assert f"gpu_tier off ({missing})" in enabled["parts"]
    assert "host_tier on" in enabled["parts"]
    (capacity,) = [e for e in loaded if e["event"] == "kv_cache_capacity"]
    assert capacity["max_concurrency"] is None and set(capacity["tiers"]) == {"host"}
    assert capacity["unreadable"] == {"gpu": f"unreadable on vLLM 0.35.0: {missing}"}
    (line,) = [r.getMessage() for r in caplog.records if "KV cache capacity" in r.getMessage()]
    assert f"gpu tier unreadable on vLLM 0.35.0: {missing}" in line
    assert "max concurrency" not in line
    samples = scrape(plugin.state().telemetry.metrics_url)
    assert value(samples, "kvobs_engine_info", engine_version="0.35.0", support="untested") == 1
    assert value(samples, "kvobs_part_enabled", part="gpu_tier") == 0
    assert value(samples, "kvobs_part_enabled", part="host_tier") == 1
    assert not [name for (name, labels), _ in samples.items()
                if name.startswith("kvobs_tier_") and ("tier", "gpu") in labels]
    assert scheduler.kv_cache_manager.block_pool.get_new_blocks.__func__  # vLLM untouched
