"""The host tier of a real LMCache 0.5.6 LocalCPUBackend alone: kvobs equals LMCache's
own state in the corners a connector's run rarely reaches (duplicate puts and reads, a
chunk removed while read, ``clear``).

Every step is checked by :class:`kvobs.testing.Conformance` against the engine's own
account (chunks in ``hot_cache``; live memory objects as LMCache's allocator reports
them to its stats monitor), flows exact. The engine as a connector drives it is
``test_lmcache_engine.py``.
"""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
import torch
from lmcache.observability import LMCStatsMonitor
from lmcache.utils import CacheEngineKey
from lmcache.v1.config import LMCacheEngineConfig
from lmcache.v1.memory_allocators.mixed_memory_allocator import MixedMemoryAllocator
from lmcache.v1.memory_allocators.tensor_memory_allocator import TensorMemoryAllocator
from lmcache.v1.memory_management import MemoryObj
from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend

from kvobs.adapters import AdapterError
from kvobs.adapters.lmcache import LMCacheInstrumentation, instrument_local_cpu_backend
from kvobs.adapters.lmcache import backend as adapter
from kvobs.recorder import Recorder
from kvobs.testing import Conformance

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


def engine_truth(b: LocalCPUBackend):
    """LMCache's own account: cached = its hot cache, in use = the other live memory
    objects as its allocator reports them to its stats monitor."""
    def truth() -> dict[str, tuple[int, int]]:
        cached = len(b.hot_cache)
        live = LMCStatsMonitor.GetOrCreate().active_memory_objs_count
        return {"host": (live - cached, cached)}
    return truth


def allocate(b: LocalCPUBackend) -> MemoryObj:
    obj = b.allocate(SHAPE, torch.float16, busy_loop=False)
    assert obj is not None
    return obj


def put(b: LocalCPUBackend, i: int, kit: Conformance) -> None:
    """What LMCache's storage manager does per chunk: allocate, put, drop its reference."""
    obj = allocate(b)
    kit.check(f"allocate {i}")
    b.submit_put_task(key(i), obj)
    kit.check(f"put {i}")
    obj.ref_count_down()   # the writer's reference; the hot cache keeps its own
    kit.check(f"writer of {i} done")


@pytest.fixture
def instrumented():
    b = backend()
    rec = Recorder(engine="lmcache", model="tiny-llama")
    inst = instrument_local_cpu_backend(b, rec, block_tokens=CHUNK_TOKENS, block_bytes=CHUNK_BYTES)
    assert inst.active
    yield b, rec, inst, Conformance(rec, truth=engine_truth(b))
    inst.unwrap()
    b.clear()   # release the hot cache's references before the allocator goes away


def test_puts_lookups_gets_and_capacity_evictions(instrumented):
    b, rec, _, kit = instrumented
    monitor = LMCStatsMonitor.GetOrCreate()
    evicted_before = monitor.interval_local_cpu_evict_keys_count
    for i in range(12):                   # 12 chunks into 8: allocate evicts the oldest
        put(b, i, kit)
    host = rec.snapshot().tier("host")
    evicted = monitor.interval_local_cpu_evict_keys_count - evicted_before
    assert host.capacity_blocks == CHUNKS
    assert host.evictions["capacity"] == evicted == 4
    assert (host.allocations, host.stores, host.frees) == (12, 12, 12)
    assert (host.in_use_blocks, host.cached_blocks) == (0, 8)

    assert [b.contains(key(i)) for i in (0, 11)] == [False, True]
    obj = b.get_blocking(key(11))
    assert obj is not None
    kit.check("reading 11")
    obj.ref_count_down()
    kit.check("read 11")
    hits = asyncio.run(b.batched_async_contains("lookup-1", [key(8), key(9), key(0), key(10)]))
    objs = asyncio.run(b.batched_get_non_blocking("lookup-1", [key(8), key(9)]))
    kit.check("batched read")
    for got in objs:
        got.ref_count_down()
    assert hits == 2
    snap = kit.check("after reads")
    # a backend probe is not a request's lookup: those are counted at the LMCacheEngine
    assert (snap.lookups.lookups, snap.lookups.tokens) == (0, 0)
    host = snap.tier("host")
    assert (host.reuses, host.frees_to_cache, host.stores) == (3, 3, 12)
    assert snap.thrash.offloaded_reused == 3
    assert snap.thrash.offloaded_evicted_unused == 4


def test_duplicate_puts_and_gets_are_counted_once(instrumented):
    b, rec, _, kit = instrumented
    put(b, 1, kit)
    duplicate = allocate(b)
    b.submit_put_task(key(1), duplicate)     # known key: LMCache keeps the first chunk
    snap = kit.check("duplicate put")
    host = snap.tier("host")
    assert (host.stores, host.in_use_blocks, host.cached_blocks) == (1, 1, 1)
    duplicate.ref_count_down()               # the writer drops it: back to the buffer
    host = kit.check("duplicate dropped").tier("host")
    assert (host.allocations, host.stores, host.frees, host.in_use_blocks) == (2, 1, 2, 0)

    first, second = b.get_blocking(key(1)), b.get_blocking(key(1))
    assert first is second is not None
    host = kit.check("two readers").tier("host")
    assert (host.reuses, host.cached_blocks, host.in_use_blocks) == (2, 1, 0)
    first.ref_count_down()
    second.ref_count_down()
    host = kit.check("readers done").tier("host")
    assert (host.reuses, host.frees_to_cache, host.stores, host.cached_blocks) == (2, 2, 1, 1)
    assert rec.snapshot().thrash.offloaded_reused == 1   # one offloaded chunk, reused


def test_explicit_remove_of_a_chunk_being_read_and_clear(instrumented):
    b, _, _, kit = instrumented
    for i in range(5):
        put(b, i, kit)
    assert b.remove(key(0))
    kit.check("remove 0")
    assert not b.remove(key(0)), "a second remove finds nothing"
    reader = b.get_blocking(key(1))
    assert reader is not None
    assert b.remove(key(1))                  # removed while read: its memory stays live
    host = kit.check("remove 1 while read").tier("host")
    assert (host.evictions["explicit"], host.in_use_blocks, host.cached_blocks) == (2, 1, 3)
    # the flows hold whatever the allocations (the frees are derived from them): the
    # 5 chunks allocated here, and chunk 1 back in use while its reader holds it
    assert host.allocations == 5 + 1
    reader.ref_count_down()                  # the reader's drop frees it
    host = kit.check("reader of 1 done").tier("host")
    assert (host.in_use_blocks, host.cached_blocks) == (0, 3)

    b.clear()
    host = kit.check("clear").tier("host")
    assert host.evictions["reset"] == 3 and host.cached_blocks == 0 == len(b.hot_cache)
    assert host.evictions["capacity"] == 0


def test_unwrap_restores_and_bad_input_is_refused(instrumented):
    b, _, inst, _ = instrumented
    with pytest.raises(AdapterError, match="already instrumented"):
        instrument_local_cpu_backend(b, Recorder(), block_tokens=256, block_bytes=CHUNK_BYTES)
    inst.unwrap()
    assert b.allocate.__func__ is LocalCPUBackend.allocate
    assert b.memory_allocator.free.__func__ is TensorMemoryAllocator.free
    with pytest.raises(AdapterError, match="LocalCPUBackend"):
        instrument_local_cpu_backend(object(), Recorder(), block_tokens=256, block_bytes=1)


def test_kvobs_failure_is_counted_and_the_put_still_happens(monkeypatch):
    def broken(inst, new, result, key, memory_obj, *args, **kwargs):
        raise RuntimeError("reader broken")

    hooks = tuple(dataclasses.replace(h, after=broken) if h.method == "submit_put_task" else h
                  for h in adapter.SPEC.hooks)
    monkeypatch.setattr(adapter, "SPEC", dataclasses.replace(adapter.SPEC, hooks=hooks))
    b, rec = backend(), Recorder()
    inst: LMCacheInstrumentation = instrument_local_cpu_backend(
        b, rec, block_tokens=CHUNK_TOKENS, block_bytes=CHUNK_BYTES)
    obj = allocate(b)
    assert b.submit_put_task(key(1), obj) is None
    obj.ref_count_down()
    assert b.contains(key(1))
    assert rec.snapshot().errors == {"lmcache.local_cpu_backend": 1}
    inst.unwrap()
    b.clear()


def test_layerwise_batched_allocate_evicts_by_popping_the_hot_cache():
    """``batched_allocate`` (layerwise stores) on LMCache's ``MixedMemoryAllocator`` evicts
    whole chunks (every layer's key) by popping the hot cache and freeing their memory
    itself, without ``remove``: kvobs counts them as capacity evictions, as LMCache does."""
    layer_shape = torch.Size([2, CHUNK_TOKENS, 64])               # one layer: 64 KiB
    layer_bytes = CHUNK_BYTES // 2
    config = LMCacheEngineConfig.from_defaults(chunk_size=CHUNK_TOKENS, local_cpu=True,
                                               max_local_cpu_size=0.01)
    b = LocalCPUBackend(config, memory_allocator=MixedMemoryAllocator(6 * layer_bytes),
                        dst_device="cpu")
    rec = Recorder()
    inst = instrument_local_cpu_backend(b, rec, block_tokens=CHUNK_TOKENS,
                                        block_bytes=layer_bytes)
    kit = Conformance(rec, truth=engine_truth(b))
    monitor = LMCStatsMonitor.GetOrCreate()
    evicted_before = monitor.interval_local_cpu_evict_keys_count
    try:
        for i in range(4):                      # 4 chunks of 2 layers into 6 layer slots
            objs = b.batched_allocate(layer_shape, torch.float16, batch_size=2,
                                      busy_loop=False)
            assert objs is not None
            kit.check(f"allocate {i}")
            for layer_key, obj in zip(key(i).split_layers(2), objs, strict=True):
                b.submit_put_task(layer_key, obj)
                obj.ref_count_down()
            kit.check(f"put {i}")
        host = rec.snapshot().tier("host")
        evicted = monitor.interval_local_cpu_evict_keys_count - evicted_before
        assert host.evictions["capacity"] == evicted == 2   # one chunk: both its layers
        assert (host.allocations, host.stores, host.cached_blocks) == (8, 8, 6)
        assert host.capacity_blocks == 6
    finally:
        inst.unwrap()
        b.clear()
