"""Tier capacities read from vLLM's own config objects, for the startup capacity log.

* GPU: ``KVCacheConfig.num_blocks`` minus the null block, ``block_size`` of the first
  KV cache group, and bytes per block = all KV cache tensors' bytes / ``num_blocks``
  (exact for every layout: MHA, GQA, MLA, hybrid groups sharing the pool).
* Host: the CPU offloading spec's ``num_chunks`` and ``kv_bytes_per_chunk``; a chunk
  holds ``blocks_per_chunk`` GPU blocks.

Example:
    >>> gpu = gpu_tier_capacity(kv_cache_config)                # doctest: +SKIP
    >>> host = host_tier_capacity(spec, gpu)                    # doctest: +SKIP
    >>> CapacityPlan.from_blocks(...)                           # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

from kvobs.capacity import TierCapacity
from kvobs.errors import ConfigError
from kvobs.tiers import GPU, HOST


def gpu_tier_capacity(kv_cache_config: Any, tier: str = GPU) -> TierCapacity:
    """The GPU tier of a vLLM ``KVCacheConfig`` (blocks usable by requests)."""
    num_blocks = int(getattr(kv_cache_config, "num_blocks", 0))
    groups = getattr(kv_cache_config, "kv_cache_groups", None)
    if num_blocks <= 0 or not groups:
        raise ConfigError(
            f"kv_cache_config: num_blocks={num_blocks} and kv_cache_groups={groups!r} "
            "describe no KV cache: pass the KVCacheConfig the engine was initialised with"
        )
    block_tokens = int(groups[0].kv_cache_spec.block_size)
    total_bytes = sum(int(t.size) for t in getattr(kv_cache_config, "kv_cache_tensors", ()))
    return TierCapacity(tier, num_blocks - 1, block_tokens, total_bytes // num_blocks)


def host_tier_capacity(offloading_spec: Any, gpu: TierCapacity, tier: str = HOST) -> TierCapacity:
    """The host tier of a vLLM CPU offloading spec (``CPUOffloadingSpec``)."""
    chunks = getattr(offloading_spec, "num_chunks", None)
    per_chunk = getattr(offloading_spec, "blocks_per_chunk", None)
    if not isinstance(chunks, int) or not isinstance(per_chunk, int) or per_chunk <= 0:
        raise ConfigError(
            f"offloading spec: num_chunks={chunks!r}, blocks_per_chunk={per_chunk!r}: pass "
            "the CPUOffloadingSpec of the offloading connector (cpu_bytes_to_use set)"
        )
    chunk_bytes = int(getattr(offloading_spec, "kv_bytes_per_chunk", 0)) or \
        gpu.block_bytes * per_chunk
    return TierCapacity(tier, chunks, gpu.block_tokens * per_chunk, chunk_bytes)
