"""Bare SGLang 0.5.23 objects (RadixCache, HiCacheController, HostKVCache) built on CPU.

The scheduler's own stack is ``scheduler_loop``; these are the pieces a user can still
assemble by hand.

Only the GPU copy kernel of HiCache (``sgl_kernel``'s ``transfer_kv_direct``) has no CPU
build; the stand-in ``cpu_transfer_kv_direct`` replaces it, so ``HiCacheController.write``
/ ``load`` / ``start_loading`` and the host pool run their real code on CPU.
"""

from __future__ import annotations

import threading
from array import array
from collections.abc import Callable, Sequence
from types import SimpleNamespace
from typing import Any

import torch
from sglang.srt.managers.cache_controller import HiCacheController
from sglang.srt.managers.scheduler_components.pool_stats_observer import (
    SchedulerPoolStatsObserver,
)
from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
from sglang.srt.mem_cache.base_prefix_cache import InsertParams, MatchPrefixParams
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey

TOKENS, PAGE, LAYERS, HEADS, DIM = 512, 16, 2, 2, 64
Truth = Callable[[], dict[str, tuple[int, int]]]


class Request:
    """What the scheduler's ``match_prefix`` call carries in ``params.req``: an opaque tag
    to RadixCache. The scheduler's real ``Req`` objects run in ``scheduler_loop``."""


def device_pool(page: int = PAGE) -> MHATokenToKVPool:
    return MHATokenToKVPool(TOKENS, page, torch.float16, HEADS, DIM, LAYERS, "cpu", False,
                            enable_alt_stream=False)


def paged_allocator(kv: MHATokenToKVPool) -> PagedTokenToKVPoolAllocator:
    return PagedTokenToKVPoolAllocator(TOKENS, PAGE, torch.float16, "cpu", kv, False)


def radix_cache(allocator: PagedTokenToKVPoolAllocator) -> RadixCache:
    return RadixCache(CacheInitParams(disable=False, req_to_token_pool=None,
                                      token_to_kv_pool_allocator=allocator, page_size=PAGE))


def host_pool(kv: MHATokenToKVPool, ratio: float = 2.0) -> MHATokenToKVPoolHost:
    return MHATokenToKVPoolHost(kv._mha_buffer_info(), ratio, 0, PAGE, "layer_first",
                                pin_memory=False, device="cpu", device_capacity_tokens=TOKENS,
                                start_layer=0, end_layer=LAYERS)


def controller(allocator: PagedTokenToKVPoolAllocator,
               pool: MHATokenToKVPoolHost) -> HiCacheController:
    return HiCacheController(allocator, pool, PAGE, None, threading.Event(), io_backend="direct")


def cpu_transfer_kv_direct(src_layers: Sequence[torch.Tensor],
                           dst_layers: Sequence[torch.Tensor], src_indices: torch.Tensor,
                           dst_indices: torch.Tensor, page_size: int) -> None:
    """CPU stand-in for the GPU-only kernel: copy token rows ``src -> dst`` per layer."""
    for src, dst in zip(src_layers, dst_layers, strict=True):
        dst[dst_indices.to(dst.device)] = src[src_indices.to(src.device)]


def key(tokens: Sequence[int]) -> RadixKey:
    return RadixKey(token_ids=array("q", tokens))


def insert(tree: RadixCache, tokens: Sequence[int], value: torch.Tensor) -> int:
    """Insert a finished request's tokens; returns the prefix already in the tree."""
    return int(tree.insert(InsertParams(key=key(tokens), value=value)).prefix_len)


def match(tree: RadixCache, tokens: Sequence[int]) -> Any:
    """The scheduler's per-request prefix lookup (a ``MatchResult``)."""
    return tree.match_prefix(MatchPrefixParams(key=key(tokens), req=Request()))


def gpu_truth(allocator: PagedTokenToKVPoolAllocator, tree: RadixCache | None) -> Truth:
    """SGLang's own account of the GPU pages, by the code its scheduler reports them with
    (``SchedulerPoolStatsObserver``: used = max total tokens - available - evictable,
    cached = the tree's evictable tokens); with no tree, nothing is evictable."""
    def truth() -> dict[str, tuple[int, int]]:
        page = allocator.page_size
        stats = SchedulerPoolStatsObserver._get_token_info(SimpleNamespace(
            token_to_kv_pool_allocator=allocator, max_total_num_tokens=allocator.size,
            tree_cache=tree if tree is not None else SimpleNamespace(evictable_size=lambda: 0)))
        assert stats.full_num_used % page == 0 == stats.full_evictable_size % page
        return {"gpu": (stats.full_num_used // page, stats.full_evictable_size // page)}
    return truth


def host_truth(pool: MHATokenToKVPoolHost) -> Truth:
    """The host pool's own account: every reserved page holds backed-up KV."""
    def truth() -> dict[str, tuple[int, int]]:
        return {"host": (0, (pool.size - pool.available_size()) // pool.page_size)}
    return truth


def both(*truths: Truth) -> Truth:
    """One truth over several tiers."""
    def truth() -> dict[str, tuple[int, int]]:
        merged: dict[str, tuple[int, int]] = {}
        for part in truths:
            merged.update(part())
        return merged
    return truth
