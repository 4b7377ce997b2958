"""The GPU tier of real SGLang 0.5.23 allocators and the bare RadixCache, step by step.

The scheduler builds a UnifiedRadixCache (see test_scheduler_loop.py); a RadixCache is
still built by users who assemble the pieces themselves, so its path stays covered.

Every step is checked by :class:`kvobs.testing.Conformance` against SGLang's own
account (allocator ``available_size``, RadixCache ``evictable_size``), flows exact.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
from sglang.srt.mem_cache.base_prefix_cache import EvictParams
from sglang.srt.mem_cache.radix_cache import RadixCache

from kvobs.adapters import AdapterError
from kvobs.adapters._hooks import MARKER
from kvobs.adapters.sglang import gpu as adapter
from kvobs.adapters.sglang import instrument_host_pool, instrument_token_allocator
from kvobs.recorder import Recorder
from kvobs.testing import Conformance
from tests.engines.sglang0523.sglang_objects import (
    PAGE,
    TOKENS,
    device_pool,
    gpu_truth,
    insert,
    match,
    paged_allocator,
    radix_cache,
)

PROMPT = list(range(1000, 1000 + 4 * PAGE))   # 4 pages


def to_free(tier) -> int:
    """Frees to the free list (the rest of ``frees`` went to the cache)."""
    return tier.frees - tier.frees_to_cache


@pytest.fixture
def engine():
    allocator = paged_allocator(device_pool())
    tree = radix_cache(allocator)
    rec = Recorder(engine="sglang")
    inst = instrument_token_allocator(allocator, rec, tree_cache=tree)
    assert inst.active
    yield allocator, tree, rec, Conformance(rec, truth=gpu_truth(allocator, tree))
    inst.unwrap()


def test_requests_hits_and_duplicates(engine):
    allocator, tree, rec, kit = engine
    assert match(tree, PROMPT).device_prefix_len == 0          # r1: a miss
    r1 = allocator.alloc(4 * PAGE)
    kit.check("r1 running")
    assert insert(tree, PROMPT, r1) == 0                        # r1 done: cached
    gpu = kit.check("r1 cached").tier("gpu")
    assert (gpu.allocations, gpu.frees_to_cache, gpu.in_use_blocks, gpu.cached_blocks) == \
        (4, 4, 0, 4)

    r2_tokens = PROMPT[: 2 * PAGE + 5] + list(range(50, 50 + 2 * PAGE))
    hit = match(tree, r2_tokens)                                # r2 shares two pages
    assert hit.device_prefix_len == 2 * PAGE
    lock = tree.lock(hit.last_device_node)
    gpu = kit.check("r2 hit").tier("gpu")
    assert (gpu.reuses, gpu.in_use_blocks, gpu.cached_blocks) == (2, 2, 2)
    tail = allocator.alloc(2 * PAGE)
    kit.check("r2 running")
    prefix = tree.path_device_indices(hit.last_device_node)
    r2_pages = (len(r2_tokens) // PAGE) * PAGE
    insert(tree, r2_tokens[:r2_pages], torch.cat([prefix, tail])[:r2_pages])
    tree.unlock(lock)
    gpu = kit.check("r2 cached").tier("gpu")
    assert (gpu.in_use_blocks, gpu.cached_blocks) == (0, 6)

    duplicate = allocator.alloc(4 * PAGE)                       # r3 recomputed r1's prompt
    assert insert(tree, PROMPT, duplicate) == 4 * PAGE          # the tree keeps its pages
    kit.check("duplicate inserted")
    allocator.free_segment(duplicate, start_pos=0)              # the scheduler frees ours
    gpu = kit.check("duplicate freed").tier("gpu")
    assert (gpu.allocations, to_free(gpu), gpu.reuses, gpu.frees_to_cache) == (10, 4, 2, 8)
    assert (gpu.in_use_blocks, gpu.cached_blocks) == (0, 6)

    assert rec.snapshot().lookups.lookups == 0, \
        "a match is not a lookup until the scheduler admits the request (test_scheduler_loop)"


def test_evictions_deferred_frees_and_flush(engine):
    allocator, tree, _, kit = engine
    a = allocator.alloc(4 * PAGE)
    insert(tree, PROMPT, a)
    b = allocator.alloc(2 * PAGE)
    allocator.free_group_begin()
    allocator.free(b)                                           # deferred: nothing is free
    gpu = kit.check("deferred free").tier("gpu")
    assert to_free(gpu) == 0 and gpu.in_use_blocks == 2
    allocator.free_group_end()
    assert to_free(kit.check("group end").tier("gpu")) == 2

    assert tree.evict(EvictParams(num_tokens=2 * PAGE)).num_tokens_evicted == 4 * PAGE
    gpu = kit.check("evicted").tier("gpu")                      # a whole leaf goes
    assert (gpu.evictions["capacity"], to_free(gpu), gpu.cached_blocks) == (4, 2, 0)
    assert allocator.alloc(TOKENS * 2) is None                  # SGLang's None passes through

    c = allocator.alloc(3 * PAGE)
    insert(tree, PROMPT[: 3 * PAGE], c)
    held = allocator.alloc(PAGE)                                # a running request's page
    kit.check("before flush")
    tree.reset()                                                # flush_cache: tree, then pool
    allocator.clear()
    gpu = kit.check("flushed").tier("gpu")
    assert (gpu.evictions["reset"], gpu.in_use_blocks, gpu.cached_blocks) == (3, 0, 0)
    assert to_free(gpu) == 2 + 1
    assert held is not None


def test_token_allocator_without_a_tree_counts_single_tokens():
    kv = device_pool(page=1)
    allocator = TokenToKVPoolAllocator(TOKENS, torch.float16, "cpu", kv, False)
    rec = Recorder()
    kit = Conformance(rec, truth=gpu_truth(allocator, None))
    inst = instrument_token_allocator(allocator, rec)
    got = allocator.alloc(7)
    kit.check("alloc")
    allocator.free(got)
    gpu = kit.check("free").tier("gpu")
    assert (gpu.allocations, gpu.frees, gpu.block_tokens, gpu.capacity_blocks) == \
        (7, 7, 1, TOKENS)
    inst.unwrap()
    assert allocator.alloc.__func__ is TokenToKVPoolAllocator.alloc


def test_kvobs_failure_is_counted_and_the_engine_goes_on(monkeypatch):
    def broken(inst, state, result, *args, **kwargs):
        raise RuntimeError("reader broken")

    hooks = tuple(dataclasses.replace(h, after=broken) if h.method == "match_prefix" else h
                  for h in adapter.TREE_SPEC.hooks)
    monkeypatch.setattr(adapter, "TREE_SPEC", dataclasses.replace(adapter.TREE_SPEC, hooks=hooks))
    allocator = paged_allocator(device_pool())
    tree = radix_cache(allocator)
    rec = Recorder()
    inst = instrument_token_allocator(allocator, rec, tree_cache=tree)
    insert(tree, PROMPT, allocator.alloc(4 * PAGE))
    assert match(tree, PROMPT).device_prefix_len == 4 * PAGE    # the engine's answer, intact
    snap = Conformance(rec, truth=gpu_truth(allocator, tree), allow_errors=True).check()
    assert snap.errors == {"sglang.radix_cache": 1}
    assert snap.lookups.lookups == 0 and snap.tier("gpu").cached_blocks == 4
    inst.unwrap()
    assert tree.match_prefix.__func__ is RadixCache.match_prefix


def test_wrong_objects_are_refused_and_unwrap_restores(engine):
    allocator, tree, _, _ = engine
    with pytest.raises(AdapterError, match="already instrumented"):
        instrument_token_allocator(allocator, Recorder())
    with pytest.raises(AdapterError, match="BaseTokenToKVPoolAllocator"):
        instrument_token_allocator(object(), Recorder())
    with pytest.raises(AdapterError, match="BasePrefixCache"):
        instrument_token_allocator(paged_allocator(device_pool()), Recorder(),
                                   tree_cache=object())
    with pytest.raises(AdapterError, match="HostKVCache"):
        instrument_host_pool(device_pool(), Recorder())
    getattr(allocator, MARKER).unwrap()                        # the allocator and its tree
    assert allocator.free.__func__ is PagedTokenToKVPoolAllocator.free
    assert tree.evict.__func__ is RadixCache.evict
    assert not hasattr(tree, MARKER) and not hasattr(allocator, MARKER)
