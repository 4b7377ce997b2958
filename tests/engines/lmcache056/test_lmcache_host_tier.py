"""The host tier of a real LMCache 0.5.6 LocalCPUBackend: kvobs equals LMCache's own state."""

from __future__ import annotations

import asyncio

import pytest
import torch
from lmcache.observability import LMCStatsMonitor
from lmcache.utils import CacheEngineKey
from lmcache.v1.config import LMCacheEngineConfig
from lmcache.v1.memory_allocators.tensor_memory_allocator import TensorMemoryAllocator
from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend

from kvobs.adapters import AdapterError
from kvobs.adapters.lmcache import instrument_local_cpu_backend
from kvobs.recorder import Recorder

CHUNK_TOKENS = 256
SHAPE = torch.Size([2, 2, CHUNK_TOKENS, 64])      # K/V, layers, tokens, hidden: 128 KiB fp16
CHUNK_BYTES = 2 * 2 * CHUNK_TOKENS * 64 * 2
CHUNKS = 8


def backend() -> LocalCPUBackend:
    config = LMCacheEngineConfig.from_defaults(chunk_size=CHUNK_TOKENS, local_cpu=True,
                                               max_local_cpu_size=0.01)
    allocator = TensorMemoryAllocator(torch.empty(CHUNKS * CHUNK_BYTES, dtype=torch.uint8))
    return LocalCPUBackend(config, memory_allocator=allocator, dst_device="cpu")


def key(i: int) -> CacheEngineKey:
    return CacheEngineKey("tiny-llama", 1, 0, i, torch.float16)


def put(b: LocalCPUBackend, i: int) -> None:
    obj = b.allocate(SHAPE, torch.float16, busy_loop=False)
    assert obj is not None
    b.submit_put_task(key(i), obj)
    obj.ref_count_down()   # the caller's reference; the hot cache keeps its own


def assert_matches_engine(rec: Recorder, b: LocalCPUBackend) -> None:
    host = rec.snapshot().tier("host")
    assert host.capacity_blocks == CHUNKS
    assert host.cached_blocks == len(b.hot_cache)
    assert host.resident_blocks == b.memory_allocator.num_active_allocations
    assert host.allocations + host.reuses - host.frees >= host.in_use_blocks


@pytest.fixture
def instrumented():
    b = backend()
    rec = Recorder(engine="lmcache", model="tiny-llama")
    inst = instrument_local_cpu_backend(b, rec, block_tokens=CHUNK_TOKENS, block_bytes=CHUNK_BYTES)
    assert inst.active
    yield b, rec, inst
    inst.unwrap()
    b.clear()   # release the hot cache's references before the allocator goes away


def test_put_lookup_get_and_capacity_evictions(instrumented):
    b, rec, inst = instrumented
    monitor = LMCStatsMonitor.GetOrCreate()
    evicted_before = monitor.interval_local_cpu_evict_keys_count
    for i in range(12):                   # 12 chunks into 8: allocate evicts the oldest
        put(b, i)
        assert_matches_engine(rec, b)
    host = rec.snapshot().tier("host")
    evicted = monitor.interval_local_cpu_evict_keys_count - evicted_before
    assert host.evictions["capacity"] == evicted == 4
    assert host.allocations == 12 and host.frees == 12   # each written chunk got cached

    assert [b.contains(key(i)) for i in (0, 11)] == [False, True]
    obj = b.get_blocking(key(11))
    assert obj is not None
    obj.ref_count_down()
    hits = asyncio.run(b.batched_async_contains("lookup-1", [key(8), key(9), key(0), key(10)]))
    objs = asyncio.run(b.batched_get_non_blocking("lookup-1", [key(8), key(9)]))
    for got in objs:
        got.ref_count_down()
    assert hits == 2
    assert (inst.lookups, inst.lookup_hits) == (2 + 3, 1 + 2)
    snap = rec.snapshot()
    assert snap.tier("host").reuses == 3
    assert snap.thrash.offloaded_reused == 3
    assert snap.thrash.offloaded_evicted_unused == 4
    assert_matches_engine(rec, b)


def test_explicit_remove_duplicate_put_and_clear(instrumented):
    b, rec, _ = instrumented
    for i in range(5):
        put(b, i)
    assert b.remove(key(0))
    assert not b.remove(key(0)), "a second remove finds nothing"
    obj = b.allocate(SHAPE, torch.float16, busy_loop=False)
    b.submit_put_task(key(1), obj)          # duplicate key: LMCache stores nothing
    obj.ref_count_down()
    host = rec.snapshot().tier("host")
    assert host.evictions["explicit"] == 1 and host.frees == 5
    assert_matches_engine(rec, b)

    b.clear()
    host = rec.snapshot().tier("host")
    assert host.evictions["reset"] == 4 and host.cached_blocks == 0 == len(b.hot_cache)


def test_unwrap_restores_and_bad_input_is_refused(instrumented):
    b, _, inst = instrumented
    with pytest.raises(AdapterError, match="already instrumented"):
        instrument_local_cpu_backend(b, Recorder(), block_tokens=256, block_bytes=CHUNK_BYTES)
    inst.unwrap()
    assert b.allocate.__func__ is LocalCPUBackend.allocate
    with pytest.raises(AdapterError, match="LocalCPUBackend"):
        instrument_local_cpu_backend(object(), Recorder(), block_tokens=256, block_bytes=1)


def test_kvobs_failure_is_counted_and_the_put_still_happens(instrumented):
    b, rec, _ = instrumented

    def broken(keys):
        raise RuntimeError("thrash tracker broken")

    rec.thrash.offloaded = broken  # type: ignore[method-assign]
    put(b, 1)
    assert b.contains(key(1))
    assert rec.snapshot().errors == {"lmcache.local_cpu_backend": 1}
