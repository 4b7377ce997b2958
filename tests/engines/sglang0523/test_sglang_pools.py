"""Real SGLang 0.5.23 pools on CPU: the paged GPU allocator and the HiCache host pool."""

from __future__ import annotations

import pytest
import torch
from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost

from kvobs.adapters import AdapterError
from kvobs.adapters.sglang import instrument_host_pool, instrument_token_allocator
from kvobs.recorder import Recorder

TOKENS, PAGE, LAYERS, HEADS, DIM = 512, 16, 2, 2, 64


def device_pool(page: int = PAGE) -> MHATokenToKVPool:
    return MHATokenToKVPool(TOKENS, page, torch.float16, HEADS, DIM, LAYERS, "cpu", False,
                            enable_alt_stream=False)


def host_pool(kv: MHATokenToKVPool) -> MHATokenToKVPoolHost:
    return MHATokenToKVPoolHost(kv._mha_buffer_info(), 2.0, 0, PAGE, "layer_first",
                                pin_memory=False, device="cpu", device_capacity_tokens=TOKENS,
                                start_layer=0, end_layer=LAYERS)


class EvictableTokens:
    """The one number kvobs reads from SGLang's RadixCache: tokens it could evict."""

    def __init__(self) -> None:
        self.tokens = 0

    def evictable_size(self) -> int:
        return self.tokens


def test_paged_allocator_pages_match_the_allocator():
    kv = device_pool()
    allocator = PagedTokenToKVPoolAllocator(TOKENS, PAGE, torch.float16, "cpu", kv, False)
    rec = Recorder(engine="sglang")
    tree = EvictableTokens()
    inst = instrument_token_allocator(allocator, rec, tree_cache=tree)
    assert inst.active
    a = allocator.alloc(4 * PAGE)
    b = allocator.alloc(2 * PAGE)
    allocator.free_group_begin()
    allocator.free(b)                      # deferred: nothing is free yet
    assert rec.snapshot().tier("gpu").frees == 0
    allocator.free_group_end()
    tree.tokens = 2 * PAGE                 # the radix cache keeps two of a's pages for reuse
    gpu = rec.snapshot().tier("gpu")
    assert (gpu.allocations, gpu.frees) == (6, 2)
    assert gpu.capacity_blocks == allocator.size // PAGE
    assert gpu.resident_blocks == (allocator.size - allocator.available_size()) // PAGE == 4
    assert (gpu.in_use_blocks, gpu.cached_blocks) == (2, 2)
    assert allocator.alloc(TOKENS * 2) is None   # out of pages: SGLang's None passes through
    allocator.free(a)
    assert rec.snapshot().tier("gpu").frees == 6
    inst.unwrap()
    assert allocator.alloc.__func__ is PagedTokenToKVPoolAllocator.alloc


def test_token_allocator_counts_single_tokens():
    kv = device_pool(page=1)
    allocator = TokenToKVPoolAllocator(TOKENS, torch.float16, "cpu", kv, False)
    rec = Recorder()
    instrument_token_allocator(allocator, rec)
    allocator.free(allocator.alloc(7))
    gpu = rec.snapshot().tier("gpu")
    assert (gpu.allocations, gpu.frees, gpu.block_tokens) == (7, 7, 1)


def test_host_pool_backups_drops_and_evictions():
    pool = host_pool(device_pool())
    rec = Recorder(engine="sglang")
    inst = instrument_host_pool(pool, rec)
    assert inst.active
    pages = pool.size // PAGE
    held = [pool.alloc(PAGE) for _ in range(pages)]
    assert pool.alloc(PAGE) is None                     # full: the backup is dropped
    pool.free(torch.cat(held[:3]))
    snap = rec.snapshot()
    host = snap.tier("host")
    assert host.capacity_blocks == pages and host.block_bytes == PAGE * pool.size_per_token
    assert host.stores == pages and host.evictions["other"] == 3
    assert host.cached_blocks == (pool.size - pool.available_size()) // PAGE == pages - 3
    assert snap.link("gpu", "host").drops == 1
    pool.clear()
    assert rec.snapshot().tier("host").evictions["reset"] == pages - 3


def test_wrong_objects_are_refused():
    with pytest.raises(AdapterError, match="BaseTokenToKVPoolAllocator"):
        instrument_token_allocator(object(), Recorder())
    with pytest.raises(AdapterError, match="HostKVCache"):
        instrument_host_pool(device_pool(), Recorder())
