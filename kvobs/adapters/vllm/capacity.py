"""Tier capacities read from vLLM's own config objects, for the startup capacity log.

* GPU: ``KVCacheConfig.num_blocks`` minus the null block, ``block_size`` of the first
  KV cache group, and bytes per block = the backing allocation's bytes / ``num_blocks``.
  In vLLM 0.33 every ``KVCacheTensor`` describes a placement inside one shared backing
  allocation and its ``size`` is that allocation's total (vLLM's own offloading config
  reads it the same way): a hybrid model (full + sliding-window groups) lists one tensor
  per group with the same size, so summing them would double the bytes. Exact for MHA,
  GQA, MLA and hybrid groups sharing the pool. Host-resident groups and tensors (vLLM
  HiSparse's host source) are not the GPU's.
* HiSparse host pool (:func:`hisparse_host_capacity`): ``hisparse_host_num_blocks``
  minus its null block, the host source group's block size, and bytes per block =
  ``hisparse_host_block_stride`` (the physical bytes between host blocks: the page of
  every sparse layer, rounded up when TP ranks share one pool). A primary tier: every
  computed page needs a host block.
* Host: chunks from the CPU offloading manager; bytes per chunk from its published
  config (``config_info()``, vLLM 0.33) or else from the offloading spec's
  ``kv_bytes_per_chunk`` (vLLM 0.32, where the manager publishes none). A chunk holds
  ``blocks_per_chunk`` GPU blocks. Unknown bytes are 0, and a tier with 0 bytes per
  block exports no byte series: no figure rather than a wrong 0.

Example:
    >>> gpu = gpu_tier_capacity(kv_cache_config)                # doctest: +SKIP
    >>> host = host_tier_capacity(offloading_manager, tokens_per_chunk=64)  # doctest: +SKIP
    >>> CapacityPlan.from_blocks(...)                           # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

from kvobs.capacity import TierCapacity
from kvobs.errors import ConfigError
from kvobs.tiers import GPU, HOST, PRIMARY


def gpu_tier_capacity(kv_cache_config: Any, tier: str = GPU) -> TierCapacity:
    """The GPU tier of a vLLM ``KVCacheConfig`` (blocks usable by requests)."""
    num_blocks = int(getattr(kv_cache_config, "num_blocks", 0))
    groups = getattr(kv_cache_config, "kv_cache_groups", None)
    if num_blocks <= 0 or not groups:
        raise ConfigError(
            f"kv_cache_config: num_blocks={num_blocks} and kv_cache_groups={groups!r} "
            "describe no KV cache: pass the KVCacheConfig the engine was initialised with"
        )
    device_groups = [g for g in groups if not getattr(g, "host_resident", False)] or groups
    block_tokens = int(device_groups[0].kv_cache_spec.block_size)
    backing = max((int(t.size) for t in getattr(kv_cache_config, "kv_cache_tensors", ())
                   if not getattr(t, "host_resident", False)),
                  default=0)  # one shared allocation: never a sum over groups
    return TierCapacity(tier, num_blocks - 1, block_tokens, backing // num_blocks)


def hisparse_host_capacity(kv_cache_config: Any, tier: str = HOST) -> TierCapacity:
    """The HiSparse host pool of a vLLM ``KVCacheConfig``: a primary tier.

    Example:
        >>> host = hisparse_host_capacity(scheduler.kv_cache_config)  # doctest: +SKIP
        >>> host.role, host.block_bytes                               # doctest: +SKIP
        ('primary', 147456)
    """
    blocks = getattr(kv_cache_config, "hisparse_host_num_blocks", None)
    stride = getattr(kv_cache_config, "hisparse_host_block_stride", None)
    source = next((g for g in getattr(kv_cache_config, "kv_cache_groups", ())
                   if getattr(g, "host_resident", False)), None)
    if not isinstance(blocks, int) or blocks <= 0 or source is None:
        raise ConfigError(
            f"kv_cache_config: hisparse_host_num_blocks={blocks!r} and no host-resident "
            "group: pass the KVCacheConfig of a HiSparse engine (HiSparseConnector with "
            "host_pool_gib)")
    return TierCapacity(tier, blocks - 1, int(source.kv_cache_spec.block_size),
                        stride if isinstance(stride, int) and stride > 0 else 0,
                        role=PRIMARY)


def request_blocks(vllm_config: Any, kv_cache_config: Any) -> tuple[int, int]:
    """Blocks one request of ``max_model_len`` needs, ``(gpu, host)``, as vLLM's own
    maximum-concurrency figure counts them: per KV cache group, the group's maximum
    memory per request over its page size, summed over the groups of each pool
    (host-resident groups draw from the HiSparse host pool).

    Raises:
        Exception: whatever a spec kvobs cannot read raises; the caller reads it through
            :func:`~kvobs.adapters.api.guarded`, which counts it, and the capacity log
            then goes by tokens.
    """
    gpu = host = 0
    for group in getattr(kv_cache_config, "kv_cache_groups", ()):
        spec = group.kv_cache_spec
        needed = -(-int(spec.max_memory_usage_bytes(vllm_config)) // int(spec.page_size_bytes))
        if getattr(group, "host_resident", False):
            host += needed
        else:
            gpu += needed
    return gpu, host


def readable_kv_cache_config(kv_cache_config: Any) -> bool:
    """Whether :func:`gpu_tier_capacity` can read ``kv_cache_config``."""
    groups: Any = getattr(kv_cache_config, "kv_cache_groups", None)
    return (isinstance(getattr(kv_cache_config, "num_blocks", None), int)
            and kv_cache_config.num_blocks > 0 and bool(groups)
            and hasattr(getattr(groups[0], "kv_cache_spec", None), "block_size"))


def host_tier_capacity(offloading_manager: Any, tokens_per_chunk: int,
                       tier: str = HOST, spec: Any = None) -> TierCapacity:
    """The host tier of a vLLM ``CPUOffloadingManager``, from its ``config_info()``
    (``cpu_num_chunks``, ``cpu_kv_cache_size_bytes``: what vLLM 0.33 publishes as
    ``vllm:kv_offload_config_info``) or, without one, from its chunk count and ``spec``'s
    ``num_chunks`` and ``kv_bytes_per_chunk`` (the ``OffloadingSpec`` that made the manager,
    vLLM 0.32);
    ``tokens_per_chunk`` = GPU block size x ``blocks_per_chunk``.
    """
    infos = offloading_manager.config_info() if hasattr(offloading_manager, "config_info") \
        else ()
    info = dict(infos[0]) if infos else {}
    chunks = info.get("cpu_num_chunks", getattr(spec, "num_chunks", None))
    if not isinstance(chunks, int) or chunks < 0:
        raise ConfigError(
            f"offloading manager: cpu_num_chunks={chunks!r}: pass the CPUOffloadingManager "
            "of the offloading connector (cpu_bytes_to_use set), its OffloadingSpec, or "
            "the capacity in chunks"
        )
    size = info.get("cpu_kv_cache_size_bytes")
    if chunks and isinstance(size, int):
        chunk_bytes = size // chunks
    else:
        per_chunk = getattr(spec, "kv_bytes_per_chunk", 0)
        chunk_bytes = per_chunk if isinstance(per_chunk, int) and per_chunk > 0 else 0
    return TierCapacity(tier, chunks, tokens_per_chunk, chunk_bytes)
