"""kvobs on SGLang 0.5.23's own scheduler stack: real ``Req`` objects through the
scheduler's functions (``scheduler_loop``), every kvobs series against SGLang's figures.

===============================  =====================================================
kvobs                            SGLang's own account
===============================  =====================================================
lookups, lookup tokens           requests its ``PrefillAdder`` admitted; its
                                 ``log_hit_tokens + log_input_tokens``
GPU / host hit tokens            ``PrefillAdder.log_{device,host}_hit_tokens`` and each
                                 ``Req.cached_tokens_{device,host}`` from
                                 ``prepare_for_extend`` (what it reports as
                                 ``cached_tokens`` by source)
GPU evictions (pages)            ``sglang:evicted_tokens_total`` / page
gpu->host blocks, bytes          ``sglang:hicache_backup_tokens_total{pool="kv"}`` /
                                 page, ``sglang:hicache_backup_bytes_total``
host->gpu blocks, bytes          ``sglang:load_back_tokens_total``, ``..._bytes_total``
transfer seconds                 ``sglang:*_duration_seconds`` (none on CPU)
gpu->host drops (pages)          ``sglang:hicache_dropped_tokens_total`` / page
GPU / host occupancy             what its scheduler reports (at every step): the pool
                                 stats observer's used and evictable tokens, the
                                 metrics reporter's ``hicache_host_used_tokens``
GPU / host capacity              the observer's ``full_capacity`` (max total tokens),
                                 ``hicache_host_total_tokens``
===============================  =====================================================

Every step is also checked by :class:`kvobs.testing.Conformance` (flows explain the
occupancy SGLang reports). The bytes a load-back moved are checked too: the device KV
of every admitted prefix holds its tokens.
"""

from __future__ import annotations

import dataclasses
import random

import pytest
import structlog.testing
from sglang.srt.managers.cache_controller import HiCacheController
from sglang.srt.mem_cache.base_prefix_cache import EvictParams
from sglang.srt.mem_cache.hicache_storage import PoolName
from sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller import HybridCacheController
from sglang.srt.mem_cache.pool_host import PoolEntry
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

from kvobs.adapters import AdapterError
from kvobs.adapters._hooks import MARKER
from kvobs.adapters.sglang import gpu as gpu_adapter
from kvobs.adapters.sglang import host as host_adapter
from kvobs.adapters.sglang import instrument_cache_controller, instrument_token_allocator
from kvobs.recorder import Recorder
from kvobs.testing import Conformance
from tests.engines.sglang0523.scheduler_loop import (
    DIM,
    HEADS,
    LAYERS,
    Engine,
    install_timing_stand_in,
)

PAGE = 16


def instrumented(engine: Engine) -> tuple[Recorder, Conformance]:
    """kvobs as a user attaches it: the allocator with its tree, then the controller."""
    rec = Recorder(engine="sglang", thrash_window_s=3600.0)  # every load-back in the window
    gpu = instrument_token_allocator(engine.allocator, rec, tree_cache=engine.tree)
    host = instrument_cache_controller(engine.controller, rec)
    assert gpu.active and host.active
    # Writes are queued unflushed until the next check_hicache_events: stores lead the
    # transfers inside a step; they are compared once the loop drained.
    return rec, Conformance(rec, truth=engine.truth, stores_match_transfers=False)


def drive(engine: Engine, kit: Conformance) -> None:
    """Step the scheduler until it drains, checking kvobs against SGLang at every step."""
    for n in range(1000):
        kind = engine.step()
        kit.check(f"step {n} ({kind})")
        if kind == "idle" and not engine.waiting:
            engine.tree.check_hicache_events()
            kit.check("drained")
            return
    raise AssertionError("the loop did not drain")


def prompts(seed: int, n: int, length: int) -> list[list[int]]:
    rnd = random.Random(seed)
    return [[rnd.randrange(200, 1500) for _ in range(length)] for _ in range(n)]


def host_hit_workload(engine: Engine, kit: Conformance) -> None:
    """Four prompts cached, pushed off the 16-page GPU by six others (their pages backed
    up to the host first), then asked again: host hits loaded back."""
    first = prompts(1, 4, 60)
    for p in first:
        engine.submit(p, max_new_tokens=3)
    drive(engine, kit)
    for p in prompts(2, 6, 60):
        engine.submit(p, max_new_tokens=3)
    drive(engine, kit)
    for p in first:                           # longer: the cached prefix is a hit
        engine.submit([*p, 5, 6, 7, 8, 9, 10, 11, 12], max_new_tokens=3)
    for p in first[:2]:                       # the same prompts twice: device hits
        engine.submit([*p, 5, 6, 7, 8, 9, 10, 11, 12], max_new_tokens=2)
    drive(engine, kit)


POLICIES = ("write_through", "write_back")
#: SGLang's two scheduler loops: ``event_loop_normal`` and the overlap loop (its default on
#: a GPU: a batch's results processed after the next batch is launched)
LOOPS = pytest.mark.parametrize("overlap", [False, True], ids=["normal", "overlap"])


@LOOPS
@pytest.mark.parametrize("policy", POLICIES)
def test_one_lookup_per_admitted_request_with_sglangs_cached_tokens(stand_ins, policy,
                                                                      overlap):
    engine = Engine(write_policy=policy, tokens=256, host_ratio=4.0, overlap=overlap)
    rec, kit = instrumented(engine)
    cost = 3e-5                               # a configured prefill cost, s/token
    rec.prefill_cost.set(cost)
    host_hit_workload(engine, kit)
    snap = rec.snapshot()
    lookups = snap.lookups
    # the verdict's saving: SGLang's host hit tokens, each a prefill token not recomputed
    assert snap.benefit.host_saved_s == pytest.approx(engine.host_hit_tokens * cost, rel=1e-9)
    assert snap.benefit.host_saved_s > 0 and snap.benefit.disk_saved_s == 0
    assert engine.match_calls > len(engine.admitted), "waiting requests were re-matched"
    assert lookups.lookups == len(engine.admitted) == 16
    assert lookups.tokens == engine.prompt_tokens
    assert lookups.gpu_hit == engine.device_hit_tokens == \
        sum(r.cached_tokens_device for r in engine.admitted)
    assert lookups.host_hit == engine.host_hit_tokens == \
        sum(r.cached_tokens_host for r in engine.admitted)
    assert lookups.host_hit > 0 and lookups.gpu_hit > 0
    assert engine.intact_tokens >= lookups.gpu_hit + lookups.host_hit > 0, \
        "the loaded-back KV bytes are the prompt's"
    # every token SGLang computed has a cause, from the pages kvobs was handed
    causes = lookups.miss_causes()
    assert sum(causes.values()) == engine.prompt_tokens - engine.device_hit_tokens \
        - engine.host_hit_tokens
    assert causes["cold"] > 0 and causes["unknown"] == 0, causes


@LOOPS
@pytest.mark.parametrize("policy", POLICIES)
def test_evictions_backups_and_load_backs_equal_sglangs_counters(stand_ins, policy, overlap):
    engine = Engine(write_policy=policy, tokens=256, host_ratio=4.0, overlap=overlap)
    rec, kit = instrumented(engine)
    host_hit_workload(engine, kit)
    snap = Conformance(rec, truth=engine.truth).check("drained: stores = transfers")
    gpu, host = snap.tier("gpu"), snap.tier("host")
    backup, load = snap.link("gpu", "host"), snap.link("host", "gpu")
    evicted = engine.metric("sglang:evicted_tokens_total")
    assert evicted > 0 and gpu.evictions["capacity"] * PAGE == evicted
    assert backup.blocks * PAGE == engine.metric("sglang:hicache_backup_tokens_total", pool="kv")
    assert backup.bytes == engine.metric("sglang:hicache_backup_bytes_total") > 0
    assert load.blocks * PAGE == engine.metric("sglang:load_back_tokens_total", pool="kv") > 0
    assert load.bytes == engine.metric("sglang:load_back_bytes_total")
    assert host.stores == backup.blocks and host.reuses == load.blocks
    device, host_stats = engine.pool_stats()   # capacity as SGLang's scheduler reports it
    assert gpu.capacity_blocks * PAGE == device.full_capacity
    assert host.capacity_blocks * PAGE == host_stats.hicache_host_total_tokens
    assert backup.drops == 0 == engine.metric("sglang:hicache_dropped_tokens_total",
                                              reason="host_pressure", pool="kv")
    # each page loaded back is an onload of an offloaded page (SGLang's load-back tokens)
    assert snap.thrash.onloads_in_window * PAGE == \
        engine.metric("sglang:load_back_tokens_total", pool="kv")
    assert 0 < snap.thrash.offloaded_reused <= snap.thrash.onloads_in_window


@LOOPS
def test_requests_that_stop_by_a_token_give_back_the_batch_they_overran(stand_ins, monkeypatch,
                                                                       overlap):
    """Requests that end by a stop token: in the overlap loop one may have been launched
    in one batch more by the time its result says so (a slot past its answer's KV; the
    requests that end by length are left out of that batch), and ``release_kv_cache``
    gives that slot back with the rest. kvobs's GPU tier equals SGLang's pools at every
    step, and is empty at the end."""
    from sglang.srt.mem_cache import common

    overran: dict[str, int] = {}  # slots a released request held past its answer's KV
    release = common._release_overallocated_kv_indices

    def spy(req, owned, allocated, tree):  # type: ignore[no-untyped-def]
        overran[req.rid] = allocated - (len(req.origin_input_ids) + len(req.output_ids) - 1)
        return release(req, owned, allocated, tree)

    monkeypatch.setattr(common, "_release_overallocated_kv_indices", spy)
    engine = Engine(tokens=256, host_ratio=4.0, overlap=overlap)
    rec, kit = instrumented(engine)
    stopping = set()
    for i, p in enumerate(prompts(5, 8, 40)):
        req = engine.submit(p, max_new_tokens=3 + i % 4, stops=i % 2 == 0)
        if i % 2 == 0:
            stopping.add(req.rid)
    drive(engine, kit)
    assert len(engine.finished) == 8 and len(overran) == 8
    # the overlap loop launches one more decode batch for a request that stops by a token
    # unless the next batch is a prefill (which holds no running request)
    ran_over = {rid for rid, n in overran.items() if n}
    assert ran_over <= stopping and bool(ran_over) == overlap, overran
    assert all(n in (0, 1) for n in overran.values())
    gpu = rec.snapshot().tier("gpu")
    assert gpu.in_use_blocks == 0 and gpu.allocations + gpu.reuses == gpu.frees


@LOOPS
def test_chunked_prefill_counts_each_request_once(stand_ins, overlap):
    # 60-68 token prompts: 2-3 chunks
    engine = Engine(tokens=256, host_ratio=4.0, chunk=32, overlap=overlap)
    rec, kit = instrumented(engine)
    host_hit_workload(engine, kit)
    snap = Conformance(rec, truth=engine.truth).check("drained")
    assert engine.prefill_batches > len(engine.admitted), "prompts ran in several chunks"
    lookups = snap.lookups
    assert lookups.lookups == len(engine.admitted) == 16
    assert lookups.tokens == engine.prompt_tokens
    assert lookups.gpu_hit == engine.device_hit_tokens == \
        sum(r.cached_tokens_device for r in engine.admitted)
    assert lookups.host_hit == engine.host_hit_tokens == \
        sum(r.cached_tokens_host for r in engine.admitted) > 0
    assert snap.tier("gpu").evictions["capacity"] * PAGE == \
        engine.metric("sglang:evicted_tokens_total")
    assert snap.link("gpu", "host").bytes == engine.metric("sglang:hicache_backup_bytes_total")
    assert snap.link("host", "gpu").bytes == engine.metric("sglang:load_back_bytes_total")


def test_no_transfer_durations_where_sglang_has_no_device_timing(stand_ins):
    engine = Engine(tokens=256, host_ratio=4.0)
    rec, kit = instrumented(engine)
    host_hit_workload(engine, kit)
    for link in rec.links:
        assert link.blocks > 0 and link.seconds == 0 and not link.durations
    for name in ("sglang:hicache_backup_duration_seconds_count",
                 "sglang:load_back_duration_seconds_count"):
        assert engine.metric(name) == 0, "SGLang timed a copy on CPU: compare durations"


@pytest.mark.parametrize("policy", POLICIES)
def test_durations_are_sglangs_device_times_of_the_reaped_copies(stand_ins, monkeypatch,
                                                                 policy):
    install_timing_stand_in(monkeypatch, ms=2.5)     # a GPU's timing events (stand-in)
    engine = Engine(write_policy=policy, tokens=256, host_ratio=4.0)
    rec, kit = instrumented(engine)
    host_hit_workload(engine, kit)
    snap = rec.snapshot()
    for link, metric in ((("gpu", "host"), "sglang:hicache_backup_duration_seconds"),
                         (("host", "gpu"), "sglang:load_back_duration_seconds")):
        got = snap.link(*link)
        copies = engine.metric(f"{metric}_count")
        assert copies > 0 and len(rec.link(*link).durations) == copies == got.operations
        assert got.seconds == pytest.approx(engine.metric(f"{metric}_sum"))


def test_full_host_write_through_drops_each_refused_page_once(stand_ins, monkeypatch):
    refused_pages, host_evicted = [], []
    refuse, evict_host = UnifiedRadixCache._execute_kv_backup, UnifiedRadixCache.evict_host

    def counting_refusals(self, node_id, device_value, *args, **kwargs):
        result = refuse(self, node_id, device_value, *args, **kwargs)
        if result is None:
            refused_pages.append(len(device_value) // PAGE)
        return result

    def counting_host_evictions(self, num_tokens, *args, **kwargs):
        freed = evict_host(self, num_tokens, *args, **kwargs)   # SGLang's own count
        host_evicted.append(freed)
        return freed

    monkeypatch.setattr(UnifiedRadixCache, "_execute_kv_backup", counting_refusals)
    monkeypatch.setattr(UnifiedRadixCache, "evict_host", counting_host_evictions)
    engine = Engine(write_policy="write_through", tokens=256, host_ratio=0.5)
    _, kit = instrumented(engine)
    host_hit_workload(engine, kit)
    engine.tree.evict(EvictParams(num_tokens=engine.tokens))   # every unbacked page goes
    snap = kit.check("evicted all")
    dropped = engine.metric("sglang:hicache_dropped_tokens_total",
                            reason="write_through_unbacked_eviction", pool="kv")
    assert dropped > 0 and snap.link("gpu", "host").drops * PAGE == dropped
    assert sum(refused_pages) * PAGE > dropped, "SGLang retried refused pages"
    host = snap.tier("host")
    assert sum(host_evicted) > 0 and host.evictions["capacity"] * PAGE == sum(host_evicted)
    assert host.evictions["other"] == 0


def test_full_host_write_back_drops_the_subtrees_it_destroys(stand_ins):
    engine = Engine(write_policy="write_back", tokens=256, host_ratio=0.25)
    rec, kit = instrumented(engine)
    for wave in range(3):                     # 7-page prompts, a 5-page host pool
        for p in prompts(10 + wave, 4, 100):
            engine.submit(p, max_new_tokens=3)
        drive(engine, kit)
    snap = rec.snapshot()
    dropped = engine.metric("sglang:hicache_dropped_tokens_total", reason="host_pressure",
                            pool="kv")
    assert dropped > 0 and snap.link("gpu", "host").drops * PAGE == dropped
    assert snap.tier("gpu").evictions["capacity"] * PAGE == \
        engine.metric("sglang:evicted_tokens_total")


def test_flush_cache_evicts_both_tiers(stand_ins):
    engine = Engine(tokens=256, host_ratio=4.0)
    rec, kit = instrumented(engine)
    host_hit_workload(engine, kit)
    (_, gpu_cached), (_, host_cached) = engine.truth()["gpu"], engine.truth()["host"]
    assert gpu_cached > 0 and host_cached > 0
    engine.flush_cache()
    snap = Conformance(rec, truth=engine.truth).check("flushed")
    assert engine.truth() == {"gpu": (0, 0), "host": (0, 0)}
    assert snap.tier("gpu").evictions["reset"] == gpu_cached
    assert snap.tier("host").evictions["reset"] == host_cached
    engine.submit(prompts(3, 1, 40)[0], max_new_tokens=2)   # serves again, from scratch
    drive(engine, kit)
    assert rec.snapshot().lookups.lookups == len(engine.admitted)


def test_a_kvobs_failure_is_counted_and_the_engine_goes_on(stand_ins, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("kvobs reader broken")

    def breaking(spec, method):
        return dataclasses.replace(spec, hooks=tuple(
            dataclasses.replace(h, after=broken) if h.method == method else h
            for h in spec.hooks))

    plain = Engine(tokens=256, host_ratio=4.0)
    host_hit_workload(plain, Conformance(Recorder(), truth=plain.truth, flows=False))
    monkeypatch.setattr(gpu_adapter, "TREE_SPEC",
                        breaking(gpu_adapter.TREE_SPEC, "finish_storage_prefetch_admission"))
    monkeypatch.setattr(host_adapter, "CONTROLLER_SPEC",
                        breaking(host_adapter.CONTROLLER_SPEC, "start_loading"))
    engine = Engine(tokens=256, host_ratio=4.0)
    rec, _ = instrumented(engine)
    host_hit_workload(engine, Conformance(rec, truth=engine.truth, allow_errors=True,
                                          stores_match_transfers=False))
    snap = rec.snapshot()
    # one failure each: the first retires its hook (one kvobs_hook_disabled line), the
    # later admissions and prefill batches run on SGLang's own methods
    assert len(engine.admitted) > 1 and engine.prefill_batches > 1
    assert snap.errors == {"sglang.radix_cache": 1, "sglang.cache_controller": 1}
    assert snap.lookups.lookups == 0 and snap.link("gpu", "host").blocks > 0
    for name in ("sglang:evicted_tokens_total", "sglang:load_back_tokens_total",
                 "sglang:hicache_backup_bytes_total"):
        labels = {"pool": "kv"} if "tokens_total" in name and "evicted" not in name else {}
        assert engine.metric(name, **labels) == plain.metric(name, **labels), name
    assert [r.cached_tokens_host for r in engine.admitted] == \
        [r.cached_tokens_host for r in plain.admitted]


def test_a_controller_of_another_version_instruments_nothing_and_says_so_once(stand_ins):
    engine, other = Engine(tokens=256), Engine(tokens=256)
    # a later SGLang's controller, as kvobs would meet it (its own name: the warning is
    # once per process and class)
    changed = type("NextHybridCacheController", (HybridCacheController,),
                   {"start_loading": None})
    for e in (engine, other):
        e.controller.__class__ = changed
    with structlog.testing.capture_logs() as logs:
        first = instrument_cache_controller(engine.controller, Recorder())
        second = instrument_cache_controller(other.controller, Recorder())
    assert not first.active and not second.active
    assert first.wrapped_methods == () and not hasattr(engine.controller, MARKER)
    assert not hasattr(engine.host_pool, MARKER), "the host pool is left alone too"
    warnings = [log for log in logs if log["event"] == "kvobs_adapter_unsupported_version"]
    assert len(warnings) == 1
    assert warnings[0]["problems"] == ["NextHybridCacheController.start_loading is missing"]


def test_an_unknown_member_pool_of_the_host_group_is_named(stand_ins):
    class MysteryPool:                       # what a newer SGLang might add to a group
        size_per_token = 128
        can_use_write_back_jit = False

    engine = Engine(tokens=256)
    engine.group.add_entry(PoolEntry(name=PoolName.MAMBA, host_pool=MysteryPool(),
                                     device_pool=None, layer_mapper=lambda layer: layer))
    rec = Recorder()
    with structlog.testing.capture_logs() as logs:
        inst = instrument_cache_controller(engine.controller, rec)
    named = [log for log in logs if log["event"] == "kvobs_sglang_unknown_host_pool"]
    assert [(log["pool"], log["cls"]) for log in named] == \
        [("mamba", "test_an_unknown_member_pool_of_the_host_group_is_named.<locals>."
                   "MysteryPool")]
    assert inst.active
    assert rec.snapshot().tier("host").block_bytes == PAGE * engine.host_pool.size_per_token


def test_refused_objects_and_unwrap_restores_sglangs_own(stand_ins):
    engine = Engine(tokens=256)
    with pytest.raises(AdapterError, match="HiCacheController"):
        instrument_cache_controller(engine.group, Recorder())
    rec = Recorder()
    gpu = instrument_token_allocator(engine.allocator, rec, tree_cache=engine.tree)
    host = instrument_cache_controller(engine.controller, rec)
    with pytest.raises(AdapterError, match="already instrumented"):
        instrument_cache_controller(engine.controller, Recorder())
    host.unwrap()
    gpu.unwrap()
    assert engine.tree.evict_for_alloc.__func__ is UnifiedRadixCache.evict_for_alloc
    assert engine.tree.match_prefix.__func__ is UnifiedRadixCache.match_prefix
    assert engine.controller.start_writing.__func__ is HiCacheController.start_writing
    assert engine.host_pool.alloc.__func__ is type(engine.host_pool).alloc
    for obj in (engine.allocator, engine.tree, engine.controller, engine.host_pool):
        assert not hasattr(obj, MARKER)


def test_the_gpu_tier_s_bytes_are_the_kv_pool_s(stand_ins):
    """A page's bytes across layers, as the model's shape makes them (K and V, every layer,
    fp16), read from the KV pool SGLang sized: the capacity log's GPU bytes."""
    engine = Engine(tokens=256)
    rec, _ = instrumented(engine)
    gpu = rec.snapshot().tier("gpu")
    assert gpu.block_bytes == PAGE * LAYERS * 2 * HEADS * DIM * 2
    capacity_bytes = gpu.capacity_blocks * gpu.block_bytes
    assert capacity_bytes == 256 * LAYERS * 2 * HEADS * DIM * 2
    # SGLang's own figure holds one padding page more (its K and V buffers' size)
    kv_bytes = engine.allocator.get_kvcache().mem_usage * 1024**3
    assert kv_bytes == pytest.approx(capacity_bytes + gpu.block_bytes, rel=1e-9)
