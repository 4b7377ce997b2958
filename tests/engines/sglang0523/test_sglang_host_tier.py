"""HiCache on CPU: the real host pool and HiCacheController with a CPU stand-in of the
GPU copy kernel; kvobs equals SGLang's own account at every step."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from sglang.srt.managers.cache_controller import HiCacheController
from sglang.srt.mem_cache.base_prefix_cache import EvictParams
from sglang.srt.mem_cache.pool_host import mha as host_mha

from kvobs.adapters.sglang import host as adapter
from kvobs.adapters.sglang import (
    instrument_cache_controller,
    instrument_host_pool,
    instrument_token_allocator,
)
from kvobs.recorder import Recorder
from kvobs.testing import Conformance
from tests.engines.sglang0523.sglang_objects import (
    PAGE,
    both,
    controller,
    cpu_transfer_kv_direct,
    device_pool,
    gpu_truth,
    host_pool,
    host_truth,
    insert,
    match,
    paged_allocator,
    radix_cache,
)

PROMPT = list(range(2000, 2000 + 4 * PAGE))


@pytest.fixture
def hicache(monkeypatch):
    """Allocator, RadixCache, host pool and controller, instrumented."""
    monkeypatch.setattr(host_mha, "transfer_kv_direct", cpu_transfer_kv_direct, raising=False)
    kv = device_pool()
    allocator = paged_allocator(kv)
    tree = radix_cache(allocator)
    pool = host_pool(kv, ratio=0.25)                     # 128 tokens: 8 host pages
    ctrl = controller(allocator, pool)
    rec = Recorder(engine="sglang")
    gpu = instrument_token_allocator(allocator, rec, tree_cache=tree)
    inst = instrument_cache_controller(ctrl, rec)
    assert gpu.active and inst.active
    kit = Conformance(rec, truth=both(gpu_truth(allocator, tree), host_truth(pool)))
    yield kv, allocator, tree, pool, ctrl, rec, kit
    inst.unwrap()
    gpu.unwrap()


def test_offload_evict_and_onload_round_trip(hicache):
    kv, allocator, tree, pool, ctrl, _, kit = hicache
    device = allocator.alloc(4 * PAGE)
    kv.k_buffer[0][device] = torch.arange(len(device), dtype=torch.float16)[:, None, None]
    insert(tree, PROMPT, device)
    kit.check("r1 cached on the GPU")

    host_indices = ctrl.write(device)                    # offload: host pages reserved
    assert host_indices is not None
    snap = kit.check("offloaded")
    host, offload = snap.tier("host"), snap.link("gpu", "host")
    assert (host.stores, host.cached_blocks, offload.blocks) == (4, 4, 4)
    assert offload.bytes == 4 * PAGE * pool.size_per_token
    assert pool.k_buffer[0][host_indices].flatten().tolist() == \
        kv.k_buffer[0][device].flatten().tolist(), "the stand-in kernel really copied"

    assert tree.evict(EvictParams(num_tokens=4 * PAGE)).num_tokens_evicted == 4 * PAGE
    gpu = kit.check("evicted from the GPU").tier("gpu")
    assert (gpu.evictions["capacity"], gpu.cached_blocks, gpu.in_use_blocks) == (4, 0, 0)

    loaded = ctrl.load(host_indices)                     # onload: device pages reserved
    assert loaded is not None
    assert ctrl.start_loading() >= 0
    snap = kit.check("onloaded")
    host, gpu, onload = snap.tier("host"), snap.tier("gpu"), snap.link("host", "gpu")
    assert (onload.blocks, onload.bytes) == (4, 4 * PAGE * pool.size_per_token)
    assert (host.reuses, host.frees_to_cache, host.cached_blocks) == (4, 4, 4)
    assert (gpu.allocations, gpu.in_use_blocks) == (8, 4)
    assert kv.k_buffer[0][loaded].flatten().tolist() == \
        kv.k_buffer[0][device].flatten().tolist()
    assert snap.thrash.offloaded_reused == 4

    insert(tree, PROMPT, loaded)                         # the loaded request finishes
    assert match(tree, PROMPT).device_prefix_len == 4 * PAGE
    kit.check("cached again")
    assert pool.free(host_indices) == 4 * PAGE           # host eviction
    host = kit.check("host evicted").tier("host")
    assert (host.evictions["other"], host.cached_blocks) == (4, 0)


def test_host_full_drops_backups_and_clear_resets(hicache):
    _, allocator, _, pool, ctrl, _, kit = hicache
    pages = pool.size // PAGE
    device = allocator.alloc(pages * PAGE)
    assert ctrl.write(device) is not None                # fills the host pool
    more = allocator.alloc(2 * PAGE)
    assert ctrl.write(more) is None                      # full: the backup is dropped
    snap = kit.check("dropped")
    assert snap.link("gpu", "host").drops == 2
    assert snap.tier("host").stores == pages == snap.link("gpu", "host").blocks
    pool.clear()
    host = kit.check("cleared").tier("host")
    assert (host.evictions["reset"], host.cached_blocks) == (pages, 0)


def test_host_pool_alone():
    pool = host_pool(device_pool())
    rec = Recorder()
    inst = instrument_host_pool(pool, rec)
    # No controller here: the transfers that fill the pool are not counted.
    kit = Conformance(rec, truth=host_truth(pool), stores_match_transfers=False)
    held = [pool.alloc(PAGE) for _ in range(3)]
    kit.check("reserved")
    pool.free(torch.cat(held[:2]))
    host = kit.check("freed").tier("host")
    assert (host.stores, host.evictions["other"], host.cached_blocks) == (3, 2, 1)
    assert host.capacity_blocks == pool.size // PAGE
    assert host.block_bytes == PAGE * pool.size_per_token
    inst.unwrap()
    assert pool.alloc.__func__ is type(pool).alloc


def test_kvobs_failure_is_counted_and_the_load_still_happens(monkeypatch):
    def broken(inst, state, result, *args, **kwargs):
        raise RuntimeError("reader broken")

    hooks = tuple(dataclasses.replace(h, after=broken) if h.method == "load" else h
                  for h in adapter.CONTROLLER_SPEC.hooks)
    monkeypatch.setattr(adapter, "CONTROLLER_SPEC",
                        dataclasses.replace(adapter.CONTROLLER_SPEC, hooks=hooks))
    monkeypatch.setattr(host_mha, "transfer_kv_direct", cpu_transfer_kv_direct, raising=False)
    kv = device_pool()
    allocator = paged_allocator(kv)
    ctrl = controller(allocator, host_pool(kv))
    rec = Recorder()
    inst = instrument_cache_controller(ctrl, rec)
    host_indices = ctrl.write(allocator.alloc(2 * PAGE))
    loaded = ctrl.load(host_indices)
    assert loaded is not None and len(loaded) == 2 * PAGE   # the engine's answer, intact
    assert ctrl.start_loading() >= 0
    snap = rec.snapshot()
    assert snap.errors == {"sglang.cache_controller": 1}
    assert snap.link("gpu", "host").blocks == 2              # the write still counted
    inst.unwrap()
    assert ctrl.load.__func__ is HiCacheController.load
    assert ctrl.mem_pool_host.alloc.__func__ is type(ctrl.mem_pool_host).alloc
