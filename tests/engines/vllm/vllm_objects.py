"""Builders for real vLLM 0.33 objects on CPU (no model, no GPU): pools, managers, requests.

For class-level tests; the engine loop itself is :mod:`vllm_engine`."""

from __future__ import annotations

import itertools
from typing import Any

import torch
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheTensor,
)
from vllm.v1.request import Request

BLOCK_SIZE = 16
LAYERS = 4
KV_HEADS = 2
HEAD_SIZE = 64
init_none_hash(sha256)
_ids = itertools.count()


def page_bytes() -> int:
    """Bytes of one block of one layer: K and V, fp16."""
    return 2 * BLOCK_SIZE * KV_HEADS * HEAD_SIZE * 2


def kv_cache_config(num_blocks: int) -> KVCacheConfig:
    """One full-attention group of LAYERS layers, laid out as vLLM 0.33's planner does:
    one backing allocation (``size`` is its total) with a stride per layer."""
    spec = FullAttentionSpec(block_size=BLOCK_SIZE, num_kv_heads=KV_HEADS,
                             head_size=HEAD_SIZE, dtype=torch.float16)
    layers = [f"layer.{i}" for i in range(LAYERS)]
    tensor = KVCacheTensor(size=page_bytes() * num_blocks * LAYERS, layers=layers,
                           layer_stride=page_bytes() * num_blocks, block_stride=page_bytes())
    return KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[tensor],
                         kv_cache_groups=[KVCacheGroupSpec(layers, spec)])


def kv_cache_manager(num_blocks: int, caching: bool = True) -> KVCacheManager:
    """A real KVCacheManager with stats on (so vLLM counts prefix hits too)."""
    return KVCacheManager(kv_cache_config(num_blocks), max_model_len=8192,
                          scheduler_block_size=BLOCK_SIZE, hash_block_size=BLOCK_SIZE,
                          enable_caching=caching, log_stats=True)


def request(tokens: list[int], request_id: str | None = None) -> Request:
    """A request whose block hashes vLLM computes from ``tokens``."""
    return Request(request_id or f"req-{next(_ids)}", tokens, SamplingParams(max_tokens=8),
                   None, block_hasher=get_request_block_hasher(BLOCK_SIZE, sha256))


def admit(manager: KVCacheManager, req: Request) -> Any:
    """What the scheduler does for a new request: lookup, allocate, record, cache."""
    blocks, hit_tokens, _ = manager.get_computed_blocks(req)
    new_tokens = req.num_tokens - hit_tokens
    allocated = manager.allocate_slots(req, new_tokens, num_new_computed_tokens=hit_tokens,
                                       new_computed_blocks=blocks)
    if allocated is None:
        return None
    manager.record_prefix_cache_stats(req, hit_tokens)
    req.num_computed_tokens = req.num_tokens
    manager.cache_blocks(req, req.num_tokens)
    return hit_tokens
