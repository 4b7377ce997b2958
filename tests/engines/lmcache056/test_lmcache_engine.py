"""A real LMCache 0.5.6 ``LMCacheEngine`` driven per request as its vLLM connector drives
it: every kvobs series equals LMCache's own figure.

One run of 16 requests (four multi-turn chats sharing a system prompt, one-off prompts)
through LMCache's lookup client, ``retrieve``, ``lookup_unpin`` and masked ``store``, on a
CPU backend of 24 chunks that evicts (LRU) during the run, then ``clear()``. kvobs is
attached the way a server attaches it: to the engine right after the connector built it,
before ``post_init`` builds the CPU backend. The truth is LMCache's (``lmcache:*`` series
from its ``LMCStatsMonitor``, its KV events, its backend's chunk budget) and the data a
retrieve put in the paged KV tensor; never kvobs's formula over the same fields.
"""

from __future__ import annotations

import dataclasses
import time

import pytest
import structlog.testing
import torch

from kvobs.adapters import AdapterError
from kvobs.adapters._hooks import MARKER
from kvobs.adapters.lmcache import engine as engine_adapter
from kvobs.adapters.lmcache import instrument_lmcache_engine
from kvobs.capacity import CapacityPlan
from kvobs.recorder import Recorder
from kvobs.telemetry.logs import capacity_line
from kvobs.telemetry.summary import host_pool_verdict
from kvobs.testing import Conformance, capture_telemetry
from tests.engines.lmcache056.lmcache_objects import (
    CHUNK,
    CHUNK_BYTES,
    COUNTERS,
    HOST_CHUNKS,
    INSTANCE,
    LAYERS,
    TOKEN_BYTES,
    ConnectorDriver,
    build_engine,
    chats,
    destroy,
    destroy_all,
    lmcache_metrics,
)


def delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    """Counters since ``before``; gauges as they are now (LMCache's series are process-wide
    and outlive an engine)."""
    return {k: after[k] - before[k] if k in COUNTERS else after[k] for k in after}


def host_truth(engine, instance: str = INSTANCE):
    """The host tier's ``(in_use, cached)`` as LMCache's own series give it: live memory
    objects, of which those in its hot cache are cached (for :class:`Conformance`)."""
    start = lmcache_metrics(engine, instance)

    def truth():
        now = delta(lmcache_metrics(engine, instance), start)
        cached = int(now["hot_cache_count"])
        return {"host": (int(now["active_memory_objs"]) - cached, cached)}

    return truth


@dataclasses.dataclass
class Run:
    rec: object
    inst: object
    outcomes: list
    lmcache: dict            # LMCache's series over the run, before clear()
    kv_events: int           # LMCache's KV events (one per chunk ``store`` copied)
    capacity_truth: int      # chunks LMCache held after its first eviction
    chunk_budget: int        # LMCache's own chunk budget of the backend
    steps: int
    onloads_checked: int
    cleared_tokens: int      # what LMCache's clear() says it removed
    after_clear: dict


PREFILL_COST = 2.5e-5  # seconds a prefill token costs, as an operator configures it


@pytest.fixture(scope="module", autouse=True)
def no_engine_outlives_the_module():
    yield
    destroy_all()


@pytest.fixture(scope="module")
def run():
    engine = build_engine()
    rec = Recorder(engine="lmcache", model="tiny-llama", thrash_window_s=3600.0)
    rec.prefill_cost.set(PREFILL_COST)              # a configured cost: savings are claimed
    inst = instrument_lmcache_engine(engine, rec)   # after the connector's __init__
    try:   # LMCache's storage threads keep the process alive until the engine is destroyed
        yield serve_all(engine, rec, inst)
    finally:
        inst.unwrap()
        destroy()


def serve_all(engine, rec, inst) -> Run:
    assert inst.active and inst.backend is None     # no storage yet
    engine.post_init()                               # the connector's register_kv_caches
    assert inst.backend is not None and inst.backend.active
    start = lmcache_metrics(engine)
    kit = Conformance(rec, truth=host_truth(engine))
    driver = ConnectorDriver(engine)
    outcomes, events, capacity_truth = [], 0, 0
    for prompt in chats():
        outcomes.append(driver.serve(prompt))
        kit.check(outcomes[-1].req_id)
        events += len(list(engine.get_kv_events()))
        now = delta(lmcache_metrics(engine), start)
        if not capacity_truth and now["evict_keys"]:
            capacity_truth = int(now["active_memory_objs"])
            # the buffer was full: what LMCache holds is what it can hold
            assert now["local_cache_usage"] == capacity_truth * CHUNK_BYTES
    lmcache = delta(lmcache_metrics(engine), start)
    cleared = engine.clear()
    after_clear = delta(lmcache_metrics(engine), start)
    kit.check("clear")
    return Run(rec, inst, outcomes, lmcache, events, capacity_truth,
               engine.storage_manager.local_cpu_backend.calculate_chunk_budget(), kit.steps,
               driver.onloads_checked, cleared, after_clear)


def test_the_workload_is_what_it_claims(run):
    hits = [o for o in run.outcomes if o.lmcache_hit]
    fresh = [o for o in run.outcomes if not o.lmcache_hit]
    assert len(run.outcomes) == 16
    assert len(hits) >= 6 and len(fresh) >= 4          # prefix hits and new requests
    assert any(o.vllm_cached for o in run.outcomes)     # masked retrieves (vLLM's own hit)
    assert any(o.stored_from for o in run.outcomes)     # masked stores
    assert run.lmcache["evict_keys"] > 0                # LRU evicted during the run
    assert run.onloads_checked > 0                      # the data a retrieve loaded is right


def test_lookups_are_one_per_request_with_lmcaches_tokens_and_hits(run):
    lookups, lm = run.rec.snapshot().lookups, run.lmcache
    assert lookups.lookups == lm["lookup_requests"] == len(run.outcomes)
    # LMCache's lookup client sends whole chunks only (save_unfull_chunk=False): a
    # prompt's partial last chunk is not looked up, by LMCache nor kvobs
    assert lookups.tokens == lm["lookup_tokens"] == sum(o.prompt_tokens // CHUNK * CHUNK
                                                        for o in run.outcomes)
    assert lookups.host_hit == lm["lookup_hits"] == sum(o.lmcache_hit for o in run.outcomes)
    assert lookups.disk_hit == lookups.gpu_hit == 0     # one backend: every hit is host
    # every looked-up token LMCache missed has a cause, from the chunk hashes it looked up
    causes = lookups.miss_causes()
    assert sum(causes.values()) == lm["lookup_tokens"] - lm["lookup_hits"]
    assert causes["cold"] > 0 and causes["unknown"] == 0, causes
    assert lookups.host_hit / lookups.tokens == pytest.approx(
        lm["lookup_hits"] / lm["lookup_tokens"], abs=0)
    # the verdict's saving: each token LMCache hit is a prefill token not recomputed
    benefit = run.rec.snapshot().benefit
    assert benefit.host_saved_s == pytest.approx(lm["lookup_hits"] * PREFILL_COST, rel=1e-9)
    assert benefit.host_saved_s > 0 and benefit.disk_saved_s == 0
    print(f"\nlookups kvobs {lookups.lookups} lmcache {lm['lookup_requests']:.0f}; tokens "
          f"{lookups.tokens} / {lm['lookup_tokens']:.0f}; hits {lookups.host_hit} / "
          f"{lm['lookup_hits']:.0f}; hit ratio {lookups.host_hit / lookups.tokens:.3f} / "
          f"{lm['lookup_hits'] / lm['lookup_tokens']:.3f}")


def test_retrievals_are_host_hits_onloaded_as_lmcache_counts_them(run):
    snap, lm = run.rec.snapshot(), run.lmcache
    host, onload = snap.tier("host"), snap.link("host", "gpu")
    assert lm["hit_tokens"] > 0 and lm["hit_tokens"] % CHUNK == 0
    assert host.reuses == onload.blocks == lm["hit_tokens"] // CHUNK
    assert onload.bytes == lm["hit_tokens"] * TOKEN_BYTES
    assert onload.operations == sum(1 for o in run.outcomes if o.retrieved)
    assert lm["retrieve_requests"] == sum(1 for o in run.outcomes
                                          if o.lmcache_hit - o.vllm_cached > 0)
    assert lm["hit_tokens"] == sum(o.retrieved for o in run.outcomes)
    # each chunk retrieved is an onload of an offloaded chunk (every one in the window)
    assert snap.thrash.onloads_in_window == lm["hit_tokens"] // CHUNK
    assert 0 < snap.thrash.offloaded_reused <= snap.thrash.onloads_in_window


def test_stores_and_offloads_equal_lmcaches(run):
    snap, lm = run.rec.snapshot(), run.lmcache
    host, offload = snap.tier("host"), snap.link("gpu", "host")
    assert offload.blocks == run.kv_events == lm["stored_tokens"] // CHUNK > 0
    assert offload.bytes == lm["stored_tokens"] * TOKEN_BYTES
    assert offload.operations == lm["store_requests"] == sum(1 for o in run.outcomes
                                                              if o.stored_to)
    # every chunk LMCache cached is still there, was evicted or was cleared
    cleared_chunks = run.cleared_tokens // CHUNK
    assert host.stores == lm["hot_cache_count"] + lm["evict_keys"] == \
        cleared_chunks + lm["evict_keys"]


def test_evictions_and_capacity_equal_lmcaches(run):
    host = run.rec.snapshot().tier("host")
    assert host.evictions["capacity"] == run.lmcache["evict_keys"] > 0
    assert host.capacity_blocks == run.capacity_truth == run.chunk_budget == HOST_CHUNKS
    assert host.capacity_blocks * host.block_bytes == HOST_CHUNKS * CHUNK_BYTES


def test_occupancy_equals_lmcaches_at_every_step(run):
    assert run.steps == len(run.outcomes) + 1            # Conformance checked each step
    host = run.rec.snapshot().tier("host")
    resident = host.in_use_blocks + host.cached_blocks
    assert resident * CHUNK_BYTES == run.after_clear["local_cache_usage"]


def test_transfer_seconds_are_lmcaches_own_timings(run):
    snap, lm = run.rec.snapshot(), run.lmcache
    assert snap.link("gpu", "host").seconds == pytest.approx(lm["store_from_gpu_s"], rel=1e-9)
    assert snap.link("host", "gpu").seconds == pytest.approx(lm["retrieve_to_gpu_s"], rel=1e-9)
    # one duration sample per timing LMCache took (its histograms' counts)
    with capture_telemetry(run.rec) as telemetry:
        durations = "kvobs_transfer_duration_seconds"
        assert telemetry.value(durations, src_tier="gpu", dst_tier="host") == \
            lm["store_from_gpu_n"] > 0
        assert telemetry.value(durations, src_tier="host", dst_tier="gpu") == \
            lm["retrieve_to_gpu_n"] > 0
    assert lm["store_from_gpu_s"] > 0 and lm["retrieve_to_gpu_s"] > 0


def test_clear_is_a_reset_of_what_lmcache_cleared(run):
    host = run.rec.snapshot().tier("host")
    assert run.cleared_tokens > 0
    assert host.evictions["reset"] * CHUNK == run.cleared_tokens
    assert host.cached_blocks == run.after_clear["hot_cache_count"] == 0
    assert run.rec.snapshot().errors == {}


def test_hits_behind_the_cpu_backend_are_disk_hits_as_lmcache_pinned_them(tmp_path):
    """A prefix found partly in the CPU backend and partly in LMCache's LocalDiskBackend:
    the split is where LMCache itself pinned each chunk (its ``lookup_pins``)."""
    engine = build_engine(host_chunks=8, instance="disk", disk_dir=str(tmp_path))
    engine.post_init()
    rec = Recorder()
    rec.prefill_cost.set(PREFILL_COST)
    inst = instrument_lmcache_engine(engine, rec)
    disk = engine.storage_manager.storage_backends["LocalDiskBackend"]
    try:
        before = lmcache_metrics(engine, "disk")
        truth = host_truth(engine, "disk")
        # a chunk read from disk is written back to the CPU backend: a host store with no
        # gpu->host transfer (kvobs does not count LMCache's disk reads as transfers)
        kit = Conformance(rec, truth=truth, stores_match_transfers=False)
        driver = ConnectorDriver(engine)
        prompt, other = list(range(1, 97)), list(range(500, 596))   # 6 chunks each

        def written() -> None:   # LMCache writes to disk in its own threads
            deadline = time.monotonic() + 10
            while disk.disk_worker.put_tasks and time.monotonic() < deadline:
                time.sleep(0.01)
            assert not disk.disk_worker.put_tasks

        driver.serve(prompt)
        written()
        driver.lookup_client.lookup(prompt, lookup_id="touch")    # prefix chunks now MRU
        engine.lookup_unpin("touch")
        driver.serve(other)              # evicts the prompt's last 4 chunks from the CPU
        written()
        kit.check("stored")
        lookups, saved = rec.snapshot().lookups, rec.snapshot().benefit
        hit = driver.lookup_client.lookup(prompt, lookup_id="split")
        pinned = {where: len(keys) for where, keys in engine.lookup_pins["split"].items()}
        engine.lookup_unpin("split")
        assert pinned == {"LocalCPUBackend": 2, "LocalDiskBackend": 4} and hit == 96
        after = rec.snapshot().lookups
        assert (after.host_hit - lookups.host_hit, after.disk_hit - lookups.disk_hit) == \
            (pinned["LocalCPUBackend"] * CHUNK, pinned["LocalDiskBackend"] * CHUNK)
        now = rec.snapshot().benefit       # each tier's saving: the chunks LMCache pinned there
        assert now.host_saved_s - saved.host_saved_s == pytest.approx(
            pinned["LocalCPUBackend"] * CHUNK * PREFILL_COST, rel=1e-9)
        assert now.disk_saved_s - saved.disk_saved_s == pytest.approx(
            pinned["LocalDiskBackend"] * CHUNK * PREFILL_COST, rel=1e-9)
        outcome = driver.serve(prompt)   # a retrieve from both backends (no lookup there)
        written()
        assert outcome.retrieved == 96
        kit.check("retrieved from cpu and disk")
        lm, final = delta(lmcache_metrics(engine, "disk"), before), rec.snapshot().lookups
        assert final.lookups == lm["lookup_requests"] == 5
        assert final.host_hit + final.disk_hit == lm["lookup_hits"]
        benefit = rec.snapshot().benefit
        assert benefit.host_saved_s + benefit.disk_saved_s == pytest.approx(
            lm["lookup_hits"] * PREFILL_COST, rel=1e-9)
        assert final.tokens == lm["lookup_tokens"]
    finally:
        inst.unwrap()
        destroy("disk")


# --- start-up, faults, versions ---------------------------------------------------------

def test_instrumenting_a_post_initialised_engine_attaches_the_backend_at_once():
    engine = build_engine(instance="late")
    inst = None
    try:
        engine.post_init()
        rec = Recorder()
        inst = instrument_lmcache_engine(engine, rec)
        assert inst.backend is not None and inst.backend.active
        assert rec.snapshot().tier("host").capacity_blocks == HOST_CHUNKS
        with pytest.raises(AdapterError, match="already instrumented"):
            instrument_lmcache_engine(engine, Recorder())
        backend = engine.storage_manager.local_cpu_backend
        inst.unwrap()
        # LMCache's stats monitor is process-wide: the first engine instrumented while it
        # lives (maybe the module's run) keeps it; if this one had it, it is restored
        holder = getattr(engine.stats_monitor, MARKER, None)
        assert holder is not inst
        assert holder is not None or "on_store_finished" not in vars(engine.stats_monitor)
        for obj in (engine, backend, backend.memory_allocator, engine.gpu_connector):
            assert not any(name in vars(obj) for name in (
                "lookup", "post_init", "allocate", "free", "batched_from_gpu",
                MARKER)), f"{type(obj).__name__} still wrapped"
    finally:
        if inst is not None:
            inst.unwrap()
        destroy("late")


def test_kvobs_failure_inside_lookup_is_counted_and_lmcache_goes_on(monkeypatch):
    def broken(inst, tokens, hit, *args, **kwargs):
        raise RuntimeError("kvobs reader broken")

    hooks = tuple(dataclasses.replace(h, after=broken) if h.method == "lookup" else h
                  for h in engine_adapter.SPEC.hooks)
    monkeypatch.setattr(engine_adapter, "SPEC", dataclasses.replace(engine_adapter.SPEC,
                                                                    hooks=hooks))
    engine = build_engine(instance="broken")
    engine.post_init()
    rec = Recorder()
    inst = instrument_lmcache_engine(engine, rec)
    try:
        before = lmcache_metrics(engine, "broken")
        driver = ConnectorDriver(engine)
        prompt, other = list(range(1, 84)), list(range(500, 540))
        first, _, again = driver.serve(prompt), driver.serve(other), driver.serve(prompt)
        assert first.lmcache_hit == 0 and again.lmcache_hit == len(prompt) // CHUNK * CHUNK
        assert again.retrieved == again.lmcache_hit     # LMCache served the hit
        lm = delta(lmcache_metrics(engine, "broken"), before)
        assert lm["lookup_requests"] == 3
        # the first failure retires the hook (one error, one line): the next two lookups
        # run on LMCache's own method, read by nothing
        assert rec.snapshot().errors == {"lmcache.engine": 1}
        assert engine.lookup.__func__ is type(engine).lookup and "lookup" in inst.retired
        assert rec.snapshot().lookups.lookups == 0       # the failed reads count nothing
        assert rec.snapshot().tier("host").stores == lm["stored_tokens"] // CHUNK
    finally:
        inst.unwrap()
        destroy("broken")


def test_an_engine_of_another_version_is_left_alone_with_one_warning():
    class LMCacheEngine:  # kvobs matches engines by class name
        """An engine whose lookup takes other arguments (a future LMCache)."""

        def lookup(self, token_ids, lookup_id=None):
            return 0

        def post_init(self):
            return None

    with structlog.testing.capture_logs() as logs:
        engines = [LMCacheEngine(), LMCacheEngine()]
        insts = [instrument_lmcache_engine(e, Recorder()) for e in engines]
    assert not any(i.active for i in insts)
    assert all("lookup" not in vars(e) for e in engines)
    warnings = [e for e in logs if e["event"] == "kvobs_adapter_unsupported_version"]
    assert len(warnings) == 1
    problems = " ".join(warnings[0]["problems"])
    assert "lookup(token_ids, lookup_id) does not start with (tokens, hashes, offsets)" in \
        problems
    assert "config.chunk_size is missing" in problems


def test_a_layerwise_engine_s_host_tier_holds_what_lmcache_s_memory_holds():
    """``use_layerwise``: LMCache keeps one memory object per layer of a chunk (allocated
    together, put one layer per step of ``store_layer``, evicted by ``batched_allocate``
    with all its layers, but removable one by one). The host tier counts those objects,
    each worth ``chunk_size / num_layers`` tokens, so its capacity in tokens and bytes is
    what LMCache's CPU memory holds; the same 16 requests through ``store_layer`` /
    ``retrieve_layer``, checked at every step against LMCache's own account."""
    engine = build_engine(instance="layerwise", layerwise=True)
    inst = None
    try:
        rec = Recorder(engine="lmcache", model="tiny-llama", thrash_window_s=3600.0)
        with structlog.testing.capture_logs() as logs:
            inst = instrument_lmcache_engine(engine, rec)
            engine.post_init()
        warnings = [e for e in logs if e["event"] == "kvobs_adapter_partial"]
        assert [e["setting"] for e in warnings] == ["use_layerwise"]
        assert f"each holds {CHUNK // LAYERS} tokens" in warnings[0]["problem"]
        assert "LMCache times no layerwise copy" in warnings[0]["problem"]
        backend = engine.storage_manager.local_cpu_backend
        buffer = backend.memory_allocator.pin_allocator.buffer
        layers, chunk_tokens = engine.num_layers, engine.config.chunk_size
        start = lmcache_metrics(engine, "layerwise")
        truth = host_truth(engine, "layerwise")
        # the layerwise copies are counted layer by layer: every object put in the host
        # tier was copied there first (stores match the transfers into it at every step)
        kit = Conformance(rec, truth=truth)
        driver = ConnectorDriver(engine)
        kv_events, full = 0, None
        for prompt in chats():
            driver.serve(prompt)
            kit.check(f"request {driver.served}")
            kv_events += len(list(engine.get_kv_events()))
            now = delta(lmcache_metrics(engine, "layerwise"), start)
            if full is None and now["evict_keys"]:
                full = now     # first eviction: what LMCache holds is what it can hold
        lm = delta(lmcache_metrics(engine, "layerwise"), start)
        host = rec.snapshot().tier("host")
        assert full is not None and driver.onloads_checked > 0
        # capacity: LMCache's CPU buffer, in its own usage figure and in objects held
        capacity_bytes = host.capacity_blocks * host.block_bytes
        assert capacity_bytes == buffer.numel() * buffer.element_size() == \
            full["local_cache_usage"] == HOST_CHUNKS * CHUNK_BYTES
        assert host.capacity_blocks == full["active_memory_objs"] == \
            backend.calculate_chunk_budget()
        # in tokens: the chunks those objects make (objects / layers), of chunk_size each
        capacity_tokens = host.capacity_blocks * host.block_tokens
        assert capacity_tokens == int(full["active_memory_objs"]) // layers * chunk_tokens \
            == 192
        with capture_telemetry(rec) as telemetry:
            assert telemetry.value("kvobs_tier_capacity_tokens", tier="host") == \
                capacity_tokens
            assert telemetry.value("kvobs_tier_capacity_bytes", tier="host") == \
                capacity_bytes
        plan = CapacityPlan.from_recorder(rec, request_tokens=chunk_tokens)
        assert plan.tier("host").tokens == capacity_tokens
        assert plan.requests_held("host") == full["active_memory_objs"] // layers
        # flows: one store per layer object LMCache put (a KV event per chunk), evictions
        # as LMCache counts them (layer objects), hits: every layer of a retrieved chunk
        assert lm["evict_keys"] > 0 and lm["hit_tokens"] > 0
        assert host.stores == kv_events * layers == lm["stored_tokens"] // CHUNK * layers \
            == lm["hot_cache_count"] + lm["evict_keys"]
        assert host.evictions["capacity"] == lm["evict_keys"]
        assert host.reuses == lm["hit_tokens"] // CHUNK * layers
        lookups = rec.snapshot().lookups
        assert (lookups.lookups, lookups.tokens, lookups.host_hit) == \
            (lm["lookup_requests"], lm["lookup_tokens"], lm["lookup_hits"])
        resident = host.in_use_blocks + host.cached_blocks
        assert resident * host.block_bytes == lm["local_cache_usage"]
        # copies, layer by layer: the objects and bytes the connector copied (its own
        # account), every layer of each chunk LMCache stored / retrieved; no seconds
        # (LMCache times no layerwise copy), so the onload cost is unknown, never free
        moved = engine.gpu_connector.moved
        snap = rec.snapshot()
        out, into = snap.link("gpu", "host"), snap.link("host", "gpu")
        assert [out.blocks, out.bytes] == moved["out"]
        assert [into.blocks, into.bytes] == moved["in"]
        assert out.blocks == host.stores == lm["stored_tokens"] // CHUNK * layers
        assert into.blocks == host.reuses == lm["hit_tokens"] // CHUNK * layers > 0
        # full chunks only: each object one layer's share of a chunk's KV (the bytes
        # copied; LMCache's allocation of it is rounded up to 4 KiB, the block's bytes)
        assert out.bytes == out.blocks * (CHUNK_BYTES // layers) < out.blocks * host.block_bytes
        assert out.seconds == into.seconds == lm["retrieve_to_gpu_s"] == 0
        assert "onload time unknown" in host_pool_verdict(Recorder().snapshot(), snap, 60.0)
        engine.clear()              # every layer object LMCache cached: a reset
        host = kit.check("clear").tier("host")
        assert host.evictions["reset"] == lm["hot_cache_count"] > 0 == len(backend.hot_cache)
        # every layer object LMCache stored ended reused or evicted unused (clear() took the
        # rest): the thrash tracker tells a chunk's layers apart, one block each
        thrash = rec.snapshot().thrash
        assert thrash.offloaded_reused + thrash.offloaded_evicted_unused == host.stores
        assert thrash.onloads_in_window == host.reuses
        assert rec.snapshot().errors == {}
        print(f"\nlayerwise host tier: kvobs {capacity_tokens} tokens / {capacity_bytes} B in "
              f"{host.capacity_blocks} blocks of {host.block_tokens} tokens; LMCache "
              f"{int(full['active_memory_objs'])} objects / {layers} layers x {chunk_tokens}"
              f" tokens, {int(full['local_cache_usage'])} B used when it first evicted; "
              f"stores {host.stores} ({kv_events} KV events), evictions "
              f"{host.evictions['capacity']} / {lm['evict_keys']:.0f}, reuses {host.reuses}")
    finally:
        if inst is not None:
            inst.unwrap()
        destroy("layerwise")


def test_a_layerwise_copy_counts_each_layer_when_its_step_returns():
    """LMCache's ``store_layer`` / ``retrieve_layer`` step their connector's copy
    generator once per layer of the forward pass. kvobs counts a layer once its step
    returned: after every step its counts equal what the connector copied so far (its
    own account), and a generator the engine leaves part-way (``close()``: an aborted
    request) has counted only the layers it moved."""
    engine = build_engine(instance="layerwise-steps", layerwise=True)
    inst = None
    try:
        rec = Recorder()
        inst = instrument_lmcache_engine(engine, rec)
        engine.post_init()
        connector, driver = engine.gpu_connector, ConnectorDriver(engine)
        tokens = next(chats())[:4 * CHUNK]                      # four full chunks
        slots = torch.arange(len(tokens), dtype=torch.long)     # GPU blocks 0-3
        driver.paged[:, :, :len(tokens)] = 1.0

        def counted(src: str, dst: str) -> list[int]:
            link = rec.snapshot().link(src, dst)
            return [link.blocks, link.bytes]

        store = engine.store_layer(tokens, kvcaches=driver.paged, slot_mapping=slots,
                                   sync=False)
        next(store)                         # allocates the chunks, copies layer 0
        assert counted("gpu", "host") == connector.moved["out"] and \
            connector.moved["out"][0] == 4
        for _ in range(LAYERS):             # the other layers, then the put of the last
            next(store)
            assert counted("gpu", "host") == connector.moved["out"]
        assert connector.moved["out"][0] == 4 * LAYERS
        assert list(store) == []            # done: nothing left to step

        load = engine.retrieve_layer(tokens, kvcaches=driver.paged, slot_mapping=slots,
                                     sync=False)
        assert int(next(load)) == len(tokens)   # the hit; layer 0's objects fetched
        assert counted("host", "gpu") == connector.moved["in"] == [0, 0]
        next(load)                          # layer 0's objects sent to the connector
        assert counted("host", "gpu") == connector.moved["in"] and \
            connector.moved["in"][0] == 4
        load.close()                        # the engine leaves it: layer 1 never moves
        assert counted("host", "gpu") == connector.moved["in"] == [4, 4 * CHUNK_BYTES // LAYERS]
        assert rec.snapshot().link("host", "gpu").operations == 1
        assert rec.snapshot().errors == {}
    finally:
        if inst is not None:
            inst.unwrap()
        destroy("layerwise-steps")


def test_a_layerwise_engine_whose_layers_split_no_chunk_evenly_leaves_its_tokens_out():
    """A chunk of 16 tokens over 3 layers: one memory object holds no whole number of the
    model's tokens, so no block size in tokens is right. The host tier still counts
    LMCache's objects (capacity and bytes as its buffer holds them, occupancy), and its
    token figures are left out: no token series, ``None`` in the capacity event, "tokens
    unknown" in the capacity line, one warning saying so."""
    engine = build_engine(instance="layerwise-3", layerwise=True, layers=3)
    inst = None
    try:
        rec = Recorder()
        with structlog.testing.capture_logs() as logs:
            engine.post_init()
            inst = instrument_lmcache_engine(engine, rec)
        warnings = [e for e in logs if e["event"] == "kvobs_adapter_partial"]
        assert [e["setting"] for e in warnings] == ["use_layerwise"]
        assert "its capacity in tokens is left out (16 tokens over 3 layers" in \
            warnings[0]["problem"]
        backend = engine.storage_manager.local_cpu_backend
        buffer = backend.memory_allocator.pin_allocator.buffer
        host = rec.snapshot().tier("host")
        assert host.block_tokens == 0
        assert host.capacity_blocks == backend.calculate_chunk_budget() == HOST_CHUNKS
        assert host.capacity_blocks * host.block_bytes == buffer.numel() * buffer.element_size()
        with capture_telemetry(rec) as telemetry:
            series = telemetry.collect()
            assert "kvobs_tier_capacity_tokens" not in series
            assert telemetry.value("kvobs_tier_capacity_bytes", tier="host") == \
                HOST_CHUNKS * CHUNK_BYTES
        plan = CapacityPlan.from_recorder(rec)
        event = plan.as_event()["tiers"]["host"]
        assert (event["tokens"], event["block_tokens"], event["requests_held"]) == \
            (None, None, None)
        assert event["bytes"] == HOST_CHUNKS * CHUNK_BYTES
        assert "host 24 blocks = tokens unknown = 96.0 KiB" in capacity_line(plan)
        assert "tokens unknown" in plan.describe()[0]
        # a chunk's layers allocated as store_layer allocates them: in use, as LMCache says
        layer_shape = engine.gpu_connector.get_shape(CHUNK)
        objs = backend.batched_allocate(layer_shape, torch.float16, batch_size=3,
                                        busy_loop=False)
        assert objs is not None
        host = rec.snapshot().tier("host")
        assert (host.allocations, host.in_use_blocks) == \
            (3, backend.memory_allocator.pin_allocator.num_active_allocations)
        backend.memory_allocator.batched_free(objs)
        assert rec.snapshot().tier("host").in_use_blocks == 0
    finally:
        if inst is not None:
            inst.unwrap()
        destroy("layerwise-3")


def test_an_unhealthy_engine_s_lookups_are_counted_by_neither():
    """LMCache answers a lookup of an engine marked failed with 0 and counts nothing."""
    engine = build_engine(instance="unhealthy")
    inst = None
    try:
        engine.post_init()
        rec = Recorder()
        inst = instrument_lmcache_engine(engine, rec)
        driver = ConnectorDriver(engine)
        driver.serve(list(range(1, 50)))
        before = lmcache_metrics(engine, "unhealthy")
        engine.mark_init_failed("test: storage lost")
        assert driver.lookup_client.lookup(list(range(1, 50)), lookup_id="x") == 0
        lm = delta(lmcache_metrics(engine, "unhealthy"), before)
        assert lm["lookup_requests"] == 0 and rec.snapshot().lookups.lookups == 1
        assert rec.snapshot().errors == {}
    finally:
        if inst is not None:
            inst.unwrap()
        destroy("unhealthy")


def test_a_cpu_backend_of_another_version_leaves_lookups_and_transfers_counted(monkeypatch):
    from kvobs.adapters.lmcache import backend as backend_adapter
    spec = backend_adapter.SPEC
    monkeypatch.setattr(backend_adapter, "SPEC", dataclasses.replace(
        spec, hooks=(*spec.hooks, dataclasses.replace(spec.hooks[0], method="put_v2"))))
    engine = build_engine(instance="other-backend")
    inst = None
    try:
        rec = Recorder()
        inst = instrument_lmcache_engine(engine, rec)
        with structlog.testing.capture_logs() as logs:
            engine.post_init()
        assert inst.backend is None
        assert [e["problems"] for e in logs if e["event"] ==
                "kvobs_adapter_unsupported_version"] == [["LocalCPUBackend.put_v2 is missing"]]
        before = lmcache_metrics(engine, "other-backend")
        driver = ConnectorDriver(engine)
        for prompt in (list(range(1, 84)), list(range(500, 540)), list(range(1, 84))):
            driver.serve(prompt)
        lm, snap = delta(lmcache_metrics(engine, "other-backend"), before), rec.snapshot()
        assert snap.tiers == ()                         # no host tier, not half of one
        assert (snap.lookups.lookups, snap.lookups.host_hit) == \
            (lm["lookup_requests"], lm["lookup_hits"]) == (3, 80)
        assert snap.link("gpu", "host").blocks == lm["stored_tokens"] // CHUNK
        assert snap.errors == {}
    finally:
        if inst is not None:
            inst.unwrap()
        destroy("other-backend")
