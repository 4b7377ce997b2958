"""The host tier of a real vLLM 0.33 CPUOffloadingManager (lru and arc), and transfers."""

from __future__ import annotations

import time

import pytest
import torch
from vllm.v1.kv_offload.base import (
    GPULoadStoreSpec,
    LookupResult,
    OffloadingWorker,
    ReqContext,
    TransferResult,
    make_offload_key,
)
from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

from kvobs.adapters import AdapterError
from kvobs.adapters.vllm import (
    instrument_kv_cache_manager,
    instrument_offloading_manager,
    instrument_offloading_worker,
)
from kvobs.recorder import Recorder
from tests.engines.vllm.vllm_engine import gpu_block_ids
from tests.engines.vllm.vllm_objects import admit, kv_cache_manager, request

CHUNKS = 8


def key(i: int):
    return make_offload_key(i.to_bytes(8, "big"), 0)


def assert_matches_engine(rec: Recorder, manager: CPUOffloadingManager) -> None:
    host = rec.snapshot().tier("host")
    allocated = manager._num_allocated_chunks - len(manager._free_list)
    assert host.capacity_blocks == CHUNKS
    assert host.resident_blocks == allocated
    assert host.cached_blocks == manager._num_evictable_cache_chunks
    # vLLM's own usage gauge counts only chunks pinned by a transfer (our in use):
    gauges = manager.get_stats().data["data"]
    usage = gauges["vllm:kv_offload_cpu_cache_usage_perc"][()]
    assert usage == pytest.approx(host.in_use_blocks / CHUNKS)
    assert host.allocations + host.reuses - host.frees == host.in_use_blocks


def store(manager, keys, ctx, success=True):
    out = manager.prepare_store(keys, ctx)
    if out is not None:
        manager.complete_store(out.keys_to_store, ctx, success)
    return out


@pytest.mark.parametrize("policy", ["lru", "arc"])
def test_store_lookup_load_evict_equal_the_managers_events(policy):
    manager = CPUOffloadingManager(num_chunks=CHUNKS, cache_policy=policy, enable_events=True)
    rec = Recorder(engine="vllm")
    inst = instrument_offloading_manager(manager, rec, block_tokens=64, block_bytes=1 << 20,
                                         capacity=CHUNKS)
    assert inst.active
    ctx = ReqContext(req_id="chat-1")
    manager.on_new_request(ctx)

    evicted = []
    for start in (0, 6, 12):               # 18 chunks into 8: the policy evicts
        out = store(manager, [key(i) for i in range(start, start + 6)], ctx)
        evicted += out.evicted_keys
        assert_matches_engine(rec, manager)
    assert [manager.lookup(key(i), ctx) for i in (17, 0)] == [LookupResult.HIT,
                                                             LookupResult.MISS]
    hits = [key(i) for i in range(12, 18) if manager.lookup(key(i), ctx) == LookupResult.HIT]
    manager.prepare_load(hits[:3], ctx)     # onload three chunks
    assert_matches_engine(rec, manager)
    manager.complete_load(hits[:3], ctx)
    assert_matches_engine(rec, manager)

    events = list(manager.take_events())
    host = rec.snapshot().tier("host")
    removed = sum(len(e.keys) for e in events if e.removed and not e.metadata_only)
    stored = sum(len(e.keys) for e in events if not e.removed)
    assert host.evictions["capacity"] == removed == len(evicted) > 0
    assert host.frees - 3 == host.stores == stored == 18  # every written chunk landed, cached
    assert host.reuses == 3
    assert "lookup" not in vars(manager), "per-key lookups stay unwrapped (hot in prefill)"
    thrash = rec.snapshot().thrash
    assert thrash.offloaded_reused == 3
    assert thrash.offloaded_evicted_unused == len(evicted)


@pytest.mark.parametrize("policy", ["lru", "arc"])
def test_full_tier_drops_and_failed_stores_count(policy):
    manager = CPUOffloadingManager(num_chunks=CHUNKS, cache_policy=policy)
    rec = Recorder()
    instrument_offloading_manager(manager, rec, block_tokens=64, capacity=CHUNKS)
    ctx = ReqContext(req_id="r")
    manager.on_new_request(ctx)
    store(manager, [key(i) for i in range(CHUNKS)], ctx)
    manager.prepare_load([key(i) for i in range(CHUNKS)], ctx)  # every chunk pinned
    assert manager.prepare_store([key(100), key(101)], ctx) is None
    link = rec.snapshot().link("gpu", "host")
    assert link.drops == 2
    manager.complete_load([key(i) for i in range(CHUNKS)], ctx)

    out = store(manager, [key(200), key(201)], ctx, success=False)
    assert len(out.keys_to_store) == 2
    assert rec.snapshot().link("gpu", "host").failures == 2
    assert_matches_engine(rec, manager)

    manager.reset_cache()
    host = rec.snapshot().tier("host")
    assert host.resident_blocks == 0 and host.evictions["reset"] == CHUNKS - 2
    assert_matches_engine(rec, manager)


def test_host_hits_are_attributed_to_the_requests_lookup():
    gpu_manager = kv_cache_manager(40)
    offload = CPUOffloadingManager(num_chunks=CHUNKS)
    rec = Recorder()
    instrument_kv_cache_manager(gpu_manager, rec, offloading_manager=offload,
                                host_block_tokens=32, host_chunks=CHUNKS)
    req = request(list(range(100)))
    ctx = ReqContext(req_id=req.request_id)
    offload.on_new_request(ctx)
    store(offload, [key(1), key(2)], ctx)
    offload.prepare_load([key(1), key(2)], ctx)   # what update_state_after_alloc does
    admit(gpu_manager, req)
    lookups = rec.snapshot().lookups
    assert (lookups.tokens, lookups.gpu_hit, lookups.host_hit, lookups.miss) == (100, 0, 64, 36)


class CpuCopyWorker(OffloadingWorker):
    """An OffloadingWorker that copies with torch on CPU (vLLM's own one needs CUDA)."""

    def __init__(self, gpu: torch.Tensor, host: torch.Tensor) -> None:
        self.gpu, self.host, self.done = gpu, host, []

    def _copy(self, job_id, src, dst, src_ids, dst_ids) -> bool:
        if len(src_ids) != len(dst_ids):
            return False
        start = time.perf_counter()
        dst[torch.as_tensor(dst_ids)] = src[torch.as_tensor(src_ids)]
        nbytes = len(src_ids) * src[0].numel() * src.element_size()
        self.done.append(TransferResult(job_id, True, nbytes, time.perf_counter() - start))
        return True

    def submit_store(self, job_id, src_spec, dst_spec) -> bool:
        return self._copy(job_id, self.gpu, self.host, gpu_block_ids(src_spec, [self.gpu]),
                          dst_spec.block_ids)

    def submit_load(self, job_id, src_spec, dst_spec, expedited=False) -> bool:
        return self._copy(job_id, self.host, self.gpu, src_spec.block_ids,
                          gpu_block_ids(dst_spec, [self.gpu]))

    def get_finished(self):
        done, self.done = self.done, []
        return done

    def wait(self, job_ids) -> None:
        return None


@pytest.mark.parametrize("counts", [False, True])
def test_worker_transfer_results_time_the_links(counts):
    """The worker times transfers; it counts them only where asked (the scheduler
    process counts them by default, see test_vllm_real_loop)."""
    worker = CpuCopyWorker(torch.randn(16, 1024), torch.zeros(8, 1024))
    rec = Recorder()
    instrument_offloading_worker(worker, rec, counts=counts)
    assert worker.submit_store(1, GPULoadStoreSpec([3, 4, 5], group_sizes=[3],
                                                   block_indices=[0]), CPULoadStoreSpec([0, 1, 2]))
    assert worker.submit_load(2, CPULoadStoreSpec([0, 1]), GPULoadStoreSpec(
        [9, 10], group_sizes=[2], block_indices=[0]))
    assert not worker.submit_store(3, GPULoadStoreSpec([1], group_sizes=[1], block_indices=[0]),
                                   CPULoadStoreSpec([4, 5]))  # lengths differ: refused
    results = worker.get_finished()
    assert torch.equal(worker.gpu[9], worker.gpu[3])
    snap = rec.snapshot()
    out, back = snap.link("gpu", "host"), snap.link("host", "gpu")
    if counts:  # in host chunks, the slower tier's blocks
        assert (out.operations, out.blocks, out.bytes, out.failures) == (1, 3, 3 * 4096, 2)
        assert (back.operations, back.blocks, back.bytes) == (1, 2, 2 * 4096)
    else:
        assert (out.operations, out.blocks, back.operations) == (0, 0, 0)
    assert out.seconds == pytest.approx(results[0].transfer_time)
    assert rec.link("gpu", "host").drain_durations() == [results[0].transfer_time]
    # a job the worker accepted and then reports failed (TransferResult success=False)
    assert worker.submit_store(4, GPULoadStoreSpec([6, 7, 8, 11], group_sizes=[4],
                                                   block_indices=[0]),
                               CPULoadStoreSpec([3, 4, 5, 6]))
    worker.done[-1] = TransferResult(4, False, 0, None)
    assert [r.success for r in worker.get_finished()] == [False]
    out = rec.snapshot().link("gpu", "host")
    assert out.failures == (2 + 4 if counts else 0)  # counted here only where asked
    assert out.operations == (1 if counts else 0)


def test_wrong_objects_are_refused():
    with pytest.raises(AdapterError, match="CPUOffloadingManager"):
        instrument_offloading_manager(object(), Recorder(), block_tokens=64)
    with pytest.raises(AdapterError, match="OffloadingWorker"):
        instrument_offloading_worker([], Recorder())


def test_kvobs_failure_inside_a_store_is_counted_not_raised():
    manager = CPUOffloadingManager(num_chunks=CHUNKS)
    rec = Recorder()
    instrument_offloading_manager(manager, rec, block_tokens=64, capacity=CHUNKS)

    def broken(keys):
        raise RuntimeError("thrash tracker broken")

    rec.thrash.offloaded = broken  # type: ignore[method-assign]
    ctx = ReqContext(req_id="r")
    manager.on_new_request(ctx)
    out = manager.prepare_store([key(1)], ctx)
    manager.complete_store(out.keys_to_store, ctx)
    assert manager.lookup(key(1), ctx) == LookupResult.HIT
    assert rec.snapshot().errors == {"vllm.cpu_offloading_manager": 1}


def test_capacities_come_from_vllms_own_config_objects():
    from vllm.v1.kv_offload.cpu.common import CPUOffloadingInfo

    from kvobs.adapters.vllm import gpu_tier_capacity, host_tier_capacity
    from tests.engines.vllm.vllm_objects import kv_cache_config, page_bytes

    gpu = gpu_tier_capacity(kv_cache_config(1000))
    assert (gpu.blocks, gpu.block_tokens, gpu.block_bytes) == (999, 16, 4 * page_bytes())
    info = CPUOffloadingInfo(cpu_num_chunks=CHUNKS, cpu_blocks_per_chunk=4,
                             cpu_kv_cache_size_bytes=CHUNKS * 4 * gpu.block_bytes,
                             cpu_kv_cache_size_tokens=None)
    manager = CPUOffloadingManager(num_chunks=CHUNKS, info=info)
    host = host_tier_capacity(manager, tokens_per_chunk=4 * gpu.block_tokens)
    assert (host.blocks, host.block_tokens, host.block_bytes) == (CHUNKS, 64, 4 * gpu.block_bytes)
    rec = Recorder()
    instrument_offloading_manager(manager, rec, block_tokens=64)  # capacity from config_info
    assert rec.snapshot().tier("host").capacity_blocks == CHUNKS


def test_a_manager_publishing_no_capacity_needs_one_given():
    from kvobs.errors import ConfigError

    manager = CPUOffloadingManager(num_chunks=CHUNKS)  # built without its spec's info
    with pytest.raises(ConfigError, match="capacity in chunks"):
        instrument_offloading_manager(manager, Recorder(), block_tokens=64)
    assert "prepare_store" not in vars(manager), "a refused manager is left unwrapped"


def test_second_readers_and_repeated_keys_follow_the_managers_counts():
    """A chunk read twice is idle again only after its last reader; a key completed twice
    in one call lands once; a key completed again after it landed changes nothing."""
    manager = CPUOffloadingManager(num_chunks=CHUNKS)
    rec = Recorder()
    instrument_offloading_manager(manager, rec, block_tokens=64, capacity=CHUNKS)
    ctx = ReqContext(req_id="r")
    manager.on_new_request(ctx)
    out = manager.prepare_store([key(1), key(2), key(3)], ctx)
    manager.complete_store([key(1), key(1), key(2)], ctx)
    assert_matches_engine(rec, manager)
    manager.complete_store([key(1), key(3)], ctx)
    assert_matches_engine(rec, manager)
    assert rec.snapshot().tier("host").stores == len(out.keys_to_store) == 3
    manager.prepare_load([key(1), key(2)], ctx)
    manager.prepare_load([key(1)], ctx)  # a second reader of chunk 1
    assert_matches_engine(rec, manager)
    manager.complete_load([key(1), key(2)], ctx)
    assert_matches_engine(rec, manager)
    assert rec.snapshot().tier("host").in_use_blocks == 1  # chunk 1's second reader
    manager.complete_load([key(1)], ctx)
    assert_matches_engine(rec, manager)
    manager.reset_cache()
    assert_matches_engine(rec, manager)


def test_blocks_missed_within_the_capacity_are_dropped_or_in_flight_by_vllms_own_calls():
    """A GPU block whose chunk vLLM refused to store (every host chunk pinned) misses as
    dropped; one whose chunk is still being written misses as in flight; one stored and
    missed anyway is other. The lookups' keys are the blocks' hashes, vLLM's chunk keys
    ``make_offload_key(hash, 0)``."""
    manager = CPUOffloadingManager(num_chunks=CHUNKS)
    rec = Recorder()
    rec.add_tier("gpu", 4, block_tokens=16, block_bytes=0)  # lookups count GPU blocks
    instrument_offloading_manager(manager, rec, block_tokens=16, capacity=CHUNKS)
    ctx = ReqContext(req_id="r")
    manager.on_new_request(ctx)
    store(manager, [key(i) for i in range(CHUNKS)], ctx)
    manager.prepare_load([key(i) for i in range(CHUNKS)], ctx)    # every chunk pinned
    assert manager.prepare_store([key(100), key(101)], ctx) is None  # refused
    manager.complete_load([key(i) for i in range(CHUNKS)], ctx)
    manager.prepare_store([key(200)], ctx)                          # being written
    blocks = [i.to_bytes(8, "big") for i in (100, 101, 200, 3)]
    rec.lookup(4 * 16, keys=blocks)   # all four computed: cold
    rec.lookup(4 * 16, keys=blocks)   # missed again, each within the 8 blocks the tiers hold
    causes = rec.snapshot().lookups.miss_causes()
    assert (causes["cold"], causes["dropped"], causes["in_flight"], causes["other"]) == \
        (4 * 16, 2 * 16, 16, 16)
    manager.complete_store([key(200)], ctx)  # landed: no longer in flight
    rec.lookup(16, keys=blocks[2:3])
    assert rec.snapshot().lookups.miss_causes()["other"] == 2 * 16
