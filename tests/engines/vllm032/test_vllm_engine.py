"""kvobs inside a real vLLM engine (vLLM's CPU build) running a model with a host tier.

The engine runs a multi-turn chat workload (``engine_run.py``) with prefix caching and the
stock ``OffloadingConnector`` (``cpu_offloading.py`` replaces only its CUDA copy worker),
kvobs enabled by vLLM's own plugin loader, once single-process and once as vLLM's default
multi-process engine. Every kvobs series a scrape of ``/metrics`` returns is compared with
an account kvobs does not compute:

* vLLM's own Prometheus registry (prefix cache, external hits, offload bytes / time /
  size, requests, KV cache usage, cache config);
* vLLM's KV cache events, read from its ZMQ publisher as an external consumer reads them
  (blocks stored / removed, per medium);
* the tokens vLLM returned (blocks each request held, cached tokens per request, and the
  generated tokens and log-probabilities after a host onload equal a fresh prefill's);
* the model's config (bytes per token) and the host buffers the worker allocated.
"""

from __future__ import annotations

import math

import pytest

from tests.engines.vllm032.conftest import EngineRun, Samples, run_engine
from tests.engines.vllm032.engine_run import BLOCK, GPU_BLOCKS, HOST_CHUNKS, MODEL, host_chunk_bytes

ENGINE_LABELS = {"dp_rank", "engine", "model"}
OWN_LABELS = {"tier", "state", "reason", "outcome", "src_tier", "dst_tier", "component", "le",
              "source", "engine_version", "support", "part", "cause"}
DIRECTIONS = {"store": ("gpu", "host", "GPU_to_CPU"), "load": ("host", "gpu", "CPU_to_GPU")}


def bytes_per_token() -> int:
    """From the model's config alone: K and V x layers x KV heads x head size x 4 (fp32)."""
    head = MODEL["hidden_size"] // MODEL["num_attention_heads"]
    return 2 * MODEL["num_hidden_layers"] * MODEL["num_key_value_heads"] * head * 4


# -- prefix cache lookups -----------------------------------------------------------------

def test_lookups_are_vllms_requests_and_prefix_cache_tokens(engine: EngineRun) -> None:
    kv, vllm = engine.kvobs, engine.vllm
    assert vllm.total("vllm:num_preemptions_total") == 0  # every lookup is a first one
    assert kv.total("kvobs_lookups_total") == vllm.total("vllm:request_success_total") > 0
    gpu_hit = kv.total("kvobs_lookup_tokens_total", outcome="gpu_hit")
    host_hit = kv.total("kvobs_lookup_tokens_total", outcome="host_hit")
    assert gpu_hit == vllm.total("vllm:prefix_cache_hits_total") > 0
    assert host_hit == vllm.total("vllm:external_prefix_cache_hits_total") > 0
    assert kv.total("kvobs_lookup_tokens_total") == vllm.total("vllm:prefix_cache_queries_total")
    assert kv.total("kvobs_lookup_tokens_total", outcome="disk_hit") == 0
    # vLLM's per-request figure: the tokens each request did not compute
    assert gpu_hit + host_hit == sum(r["cached"] for r in engine.account["requests"])


# -- the GPU tier ---------------------------------------------------------------------------

def test_gpu_reuses_are_the_blocks_vllm_hit(engine: EngineRun) -> None:
    """No two requests in flight share a block, so every hit reuses a cached block."""
    reuses = engine.kvobs.total("kvobs_block_reuses_total", tier="gpu")
    assert reuses * BLOCK == engine.vllm.total("vllm:prefix_cache_hits_total") > 0


def test_gpu_blocks_taken_and_returned_are_the_requests_tokens(engine: EngineRun) -> None:
    """Each request held ceil((prompt + output - 1) / block) blocks (the last sampled token
    is never computed), new or reused; all came back once the engine was idle."""
    kv = engine.kvobs
    held = sum(math.ceil((r["prompt"] + r["output"] - 1) / BLOCK)
               for r in engine.account["requests"])
    taken = kv.total("kvobs_block_allocations_total", tier="gpu") + \
        kv.total("kvobs_block_reuses_total", tier="gpu")
    assert taken == held
    assert engine.vllm.total("vllm:kv_cache_usage_perc") == 0.0
    assert kv.total("kvobs_tier_resident_blocks", tier="gpu", state="in_use") == 0
    assert kv.total("kvobs_block_frees_total", tier="gpu") == taken


def test_gpu_cache_and_evictions_are_vllms_kv_events(engine: EngineRun) -> None:
    kv, events = engine.kvobs, engine.events
    stored, removed = events.get("BlockStored/GPU", 0), events.get("BlockRemoved/GPU", 0)
    assert removed > 0
    assert kv.total("kvobs_block_evictions_total", tier="gpu", reason="capacity") == removed
    assert kv.total("kvobs_block_evictions_total", tier="gpu") == removed
    assert kv.total("kvobs_tier_resident_blocks", tier="gpu", state="cached") == stored - removed


# -- the host tier --------------------------------------------------------------------------

def test_host_tier_is_vllms_cpu_kv_events(engine: EngineRun) -> None:
    kv, events = engine.kvobs, engine.events
    stored, removed = events.get("BlockStored/CPU", 0), events.get("BlockRemoved/CPU", 0)
    assert stored > 0 and removed > 0
    assert kv.total("kvobs_block_stores_total", tier="host") == stored
    assert kv.total("kvobs_block_allocations_total", tier="host") == stored
    assert kv.total("kvobs_block_evictions_total", tier="host", reason="capacity") == removed
    assert kv.total("kvobs_block_evictions_total", tier="host") == removed
    assert kv.total("kvobs_tier_resident_blocks", tier="host", state="cached") == stored - removed
    assert kv.total("kvobs_tier_resident_blocks", tier="host", state="in_use") == 0
    assert kv.total("kvobs_tier_resident_bytes", tier="host") == \
        (stored - removed) * host_chunk_bytes()


def test_host_reads_are_the_chunks_vllm_loaded(engine: EngineRun) -> None:
    """No two requests in flight share a chunk, so each chunk vLLM loaded was one host
    reuse (cached -> in use), and every chunk written or read went back to the cache."""
    kv = engine.kvobs
    loaded = engine.vllm.total("vllm:kv_offload_load_bytes_total") // host_chunk_bytes()
    assert kv.total("kvobs_block_reuses_total", tier="host") == loaded > 0
    assert kv.total("kvobs_block_frees_total", tier="host") == \
        engine.events["BlockStored/CPU"] + loaded


def test_host_onload_gives_the_tokens_of_a_fresh_prefill(engine: EngineRun) -> None:
    """Chat 0's first prompt again, after its blocks left the GPU pool: served from the host
    tier, its greedy tokens and their log-probabilities equal those of the first run."""
    first, again = engine.request(engine.account["repeat_of"]), engine.request("repeat")
    assert first["cached"] == 0 and again["cached"] > 0
    assert engine.account["repeat_external_hits"] == again["cached"]  # all from the host
    assert again["tokens"] == first["tokens"]
    assert again["logprobs"] == pytest.approx(first["logprobs"], abs=1e-5)


# -- transfers ------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", sorted(DIRECTIONS))
def test_transfers_are_vllms_offload_counters(engine: EngineRun, kind: str) -> None:
    src, dst, transfer_type = DIRECTIONS[kind]
    kv, vllm = engine.kvobs, engine.vllm
    link = {"src_tier": src, "dst_tier": dst}
    moved = vllm.total(f"vllm:kv_offload_{kind}_bytes_total")
    assert moved > 0
    assert kv.total("kvobs_transfer_bytes_total", **link) == moved == \
        vllm.total("vllm:kv_offload_total_bytes_total", transfer_type=transfer_type)
    assert kv.total("kvobs_transfer_blocks_total", **link) * host_chunk_bytes() == moved
    assert kv.total("kvobs_transfer_operations_total", **link) == \
        vllm.total(f"vllm:kv_offload_{kind}_size_count")
    assert kv.total("kvobs_transfer_seconds_total", **link) == \
        pytest.approx(vllm.total(f"vllm:kv_offload_{kind}_time_total"), rel=1e-9)
    assert kv.total("kvobs_transfer_failures_total", **link) == 0


@pytest.mark.parametrize("kind", sorted(DIRECTIONS))
def test_transfer_durations_are_the_workers_timings(engine: EngineRun, kind: str) -> None:
    """The engine's endpoint has the duration histogram, whatever the executor: one sample
    per job, from the times vLLM's worker sends the engine core, summing to vLLM's
    offload time. The multi-process run also asks for the worker's own endpoint
    (``KVOBS_WORKER_METRICS=1``): one shard sample per job, the same times."""
    src, dst, _ = DIRECTIONS[kind]
    link = {"src_tier": src, "dst_tier": dst}
    vllm = engine.vllm
    jobs, seconds = (vllm.total(f"vllm:kv_offload_{kind}_size_count"),
                     vllm.total(f"vllm:kv_offload_{kind}_time_total"))
    histograms = [("kvobs_transfer_duration_seconds", engine.kvobs)]
    if engine.mode == "multi":
        histograms.append(("kvobs_transfer_shard_duration_seconds",
                           Samples(engine.account["kvobs_worker"])))
    for name, samples in histograms:
        assert samples.total(f"{name}_count", **link) == jobs > 0, name
        assert samples.total(f"{name}_sum", **link) == pytest.approx(seconds, rel=1e-9), name


def test_host_stores_are_the_blocks_that_landed(engine: EngineRun) -> None:
    kv = engine.kvobs
    assert kv.total("kvobs_block_stores_total", tier="host") == \
        kv.total("kvobs_transfer_blocks_total", src_tier="gpu", dst_tier="host")


# -- capacity -------------------------------------------------------------------------------

def test_capacity_log_reports_every_tier_with_vllms_sizes(engine: EngineRun) -> None:
    events = engine.log_events("kv_cache_capacity")
    assert len(events) == 1, events  # one per engine, whatever the executor
    event = events[0]
    assert event["bytes_per_token"] == bytes_per_token()
    gpu, host = event["tiers"]["gpu"], event["tiers"]["host"]
    # vLLM's own line counts the GPU pool with its null block
    vllm_tokens = [int(line.split("KV cache size: ")[1].split(" tokens")[0].replace(",", ""))
                   for line in engine.log.splitlines() if "KV cache size: " in line]
    assert vllm_tokens == [GPU_BLOCKS * BLOCK]
    assert gpu["blocks"] == GPU_BLOCKS - 1 and gpu["tokens"] == vllm_tokens[0] - BLOCK
    assert gpu["bytes"] == gpu["blocks"] * BLOCK * bytes_per_token()
    assert engine.vllm.has("vllm:cache_config_info", num_gpu_blocks=str(GPU_BLOCKS),
                           block_size=str(BLOCK))
    assert host["blocks"] == HOST_CHUNKS and host["bytes"] == HOST_CHUNKS * host_chunk_bytes()
    lines = [line for line in engine.log.splitlines() if "KV cache capacity (" in line]
    assert len(lines) == 1 and "INFO" in lines[0]  # in vLLM's own log format
    assert f"gpu {GPU_BLOCKS - 1} blocks" in lines[0]
    assert f"host {HOST_CHUNKS} blocks = {HOST_CHUNKS * BLOCK} tokens" in lines[0]
    assert f"{bytes_per_token():,} B/token" in lines[0]


def test_capacity_series_are_vllms_pools(engine: EngineRun) -> None:
    kv = engine.kvobs
    assert kv.total("kvobs_tier_capacity_blocks", tier="gpu") == GPU_BLOCKS - 1
    assert kv.total("kvobs_tier_capacity_bytes", tier="gpu") == \
        (GPU_BLOCKS - 1) * BLOCK * bytes_per_token()
    assert kv.total("kvobs_tier_capacity_blocks", tier="host") == HOST_CHUNKS
    assert kv.total("kvobs_tier_capacity_bytes", tier="host") == HOST_CHUNKS * host_chunk_bytes()


def test_host_capacity_is_the_host_memory_the_worker_allocated(single: EngineRun) -> None:
    assert single.kvobs.total("kvobs_tier_capacity_bytes", tier="host") == \
        single.account["host_buffer_bytes"]


# -- labels ---------------------------------------------------------------------------------

def test_one_label_set_per_engine_whatever_the_executor(engine: EngineRun) -> None:
    engine_sets = {labels - OWN_LABELS for labels in engine.kvobs.label_sets("kvobs_")}
    assert engine_sets == {frozenset(ENGINE_LABELS)}
    # the release vLLM's build reports, tested, and every part of its scheduler read
    assert engine.kvobs.total("kvobs_engine_info", support="tested") == 1
    parts = {got["part"]: value for sample, got, value in engine.kvobs.rows
             if sample == "kvobs_part_enabled"}
    assert {"gpu_tier", "lookups", "host_tier", "step_timing", "transfers"} <= set(parts)
    assert set(parts.values()) == {1}
    if engine.mode == "multi":  # the worker's opt-in endpoint: shard times, with its rank
        worker = Samples(engine.account["kvobs_worker"])
        assert {labels - OWN_LABELS for labels in worker.label_sets("kvobs_transfer")} == \
            {frozenset(ENGINE_LABELS | {"tp_rank"})}
        for counted in ("kvobs_transfer_bytes_total", "kvobs_transfer_duration_seconds_count"):
            assert not worker.has(counted)  # counted once, by the engine


# -- after every step -----------------------------------------------------------------------

def test_kvobs_equals_vllm_after_every_step(single: EngineRun) -> None:
    """In the single-process engine both were read after each step of the run."""
    steps = single.account["steps"]
    assert len(steps) > 30
    for n, step in enumerate(steps):
        kv, vllm = Samples(step["kvobs"]), Samples(step["vllm"])
        in_use = kv.total("kvobs_tier_resident_blocks", tier="gpu", state="in_use")
        assert in_use / (GPU_BLOCKS - 1) == pytest.approx(
            vllm.total("vllm:kv_cache_usage_perc"), abs=1e-12), f"step {n}"
        assert kv.total("kvobs_lookup_tokens_total", outcome="gpu_hit") == \
            vllm.total("vllm:prefix_cache_hits_total"), f"step {n}"
        assert kv.total("kvobs_lookup_tokens_total", outcome="host_hit") == \
            vllm.total("vllm:external_prefix_cache_hits_total"), f"step {n}"
        for kind, (src, dst, _) in DIRECTIONS.items():
            assert kv.total("kvobs_transfer_bytes_total", src_tier=src, dst_tier=dst) == \
                vllm.total(f"vllm:kv_offload_{kind}_bytes_total"), f"step {n} {kind}"


def test_prefill_cost_is_used_only_with_a_good_fit(engine: EngineRun) -> None:
    """The measured prefill cost comes from real steps timed in the engine; it is used (and
    host hits counted as saved prefill) only when the fit is tight, else none."""
    kv = engine.kvobs
    measured = kv.total("kvobs_prefill_cost_info", source="measured") == 1
    error = [v for name, _, v in kv.rows if name == "kvobs_prefill_cost_relative_error"]
    if measured:
        assert error and error[0] <= 0.10
        assert kv.total("kvobs_prefill_cost_seconds") > 0
    else:
        assert kv.total("kvobs_prefill_cost_info", source="none") == 1
        assert kv.total("kvobs_prefill_cost_seconds") == 0
        assert kv.total("kvobs_prefill_saved_seconds_total") == 0


# -- faults ---------------------------------------------------------------------------------

def test_broken_kvobs_changes_nothing_in_vllm(single: EngineRun, tmp_path_factory:
                                              pytest.TempPathFactory) -> None:
    """Every kvobs reader raising: each failure is counted, and vLLM generates the same
    tokens and reports the same figures as without kvobs."""
    broken = run_engine("single", tmp_path_factory.mktemp("broken"), KVOBS_TEST_BROKEN="1")
    plain = run_engine("single", tmp_path_factory.mktemp("plain"), KVOBS_ENABLE="0")
    assert broken.kvobs.total("kvobs_instrumentation_errors_total") > 0
    assert not plain.log_events("kvobs_enabled")
    assert plain.events, "the plain run's KV event subscriber received nothing"
    for run in (broken, single):
        assert run.account["outputs"] == plain.account["outputs"]
        for name in ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
                     "vllm:external_prefix_cache_hits_total", "vllm:request_success_total",
                     "vllm:kv_offload_store_bytes_total", "vllm:kv_offload_load_bytes_total",
                     "vllm:kv_offload_store_size_count", "vllm:kv_offload_load_size_count"):
            assert run.vllm.total(name) == plain.vllm.total(name), name
        assert run.events == plain.events


def test_no_engine_process_outlives_the_run(engine: EngineRun) -> None:
    """The multi-process engine's engine-core and worker processes end at shutdown."""
    if engine.mode == "multi":
        assert engine.account["engine_processes"] >= 2
    assert engine.account["left_running"] == []
