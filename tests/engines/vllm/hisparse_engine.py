"""A real vLLM HiSparse scheduler on CPU (0.33 and 0.34), driven as the engine core
drives it.

HiSparse runs on CUDA only: ``VllmConfig`` refuses it elsewhere ("HiSparse currently
requires NVIDIA CUDA."). Its scheduler side is platform-independent, so the test bed
builds the config without the connector, then sets what ``--kv-transfer-config
'{"kv_connector": "HiSparseConnector", "kv_connector_extra_config": {"host_pool_gib":
...}}'`` sets on a GPU host (the connector, ``attention_config.hisparse_config``, the
``BLHNC`` layout, the hybrid KV cache manager), and plans the KV cache with vLLM's own
planner from the per-layer specs a DeepSeek-V3.2-style model reports (sparse MLA latent
512 + 64 per token per layer, and the DSA indexer's cache). The model directory holds
only a ``config.json``. From vLLM 0.34 HiSparse asks the platform for its device backend,
and the CPU platform names none: the test bed names vLLM's base ``HiSparseBackend``, of
which the scheduler side reads one class attribute (``supports_shared_host_pool``: no
shared host pool, as off CUDA on 0.33) and calls nothing (:func:`name_hisparse_backend`).

What is synthesized is the GPU worker (no model runs): one sampled token per request
that finished its prompt, and the ``HiSparseConnectorWorkerMetadata`` a worker sends: the
page transfers of ``scheduler_output.kv_connector_metadata`` reported enqueued and
completed ``transfer_delay`` steps later, the host block copies reported done, and
``HiSparseKVConnectorStats`` hot-buffer counts for each decoding request. With ``workers``
TP workers each reports every transfer, aggregated with vLLM's own ``aggregate``.

Truth kept from vLLM's side (never from kvobs): ``transfers`` (the page transfers vLLM
planned and then completed, by direction), the host-pool KV events (medium ``CPU``) vLLM
published, the scheduler stats' ``kv_connector_stats`` (hot-buffer counts, host usage,
pending page transfers) and prefix-cache stats.

Example::

    scheduler = build_hisparse_scheduler(tmp_path, gpu_blocks=150, host_blocks=29)
    driver = HiSparseDriver(scheduler)
    driver.add("r0", list(range(300)), max_tokens=8)
    driver.run()
"""

from __future__ import annotations

import os
import random
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from vllm.config import (
    CacheConfig,
    DeviceConfig,
    KVEventsConfig,
    KVTransferConfig,
    ModelConfig,
    ParallelConfig,
    SchedulerConfig,
    VllmConfig,
)
from vllm.config.attention import HiSparseConfig
from vllm.distributed.kv_transfer.kv_connector.v1.hisparse.connector import (
    HiSparseConnectorWorkerMetadata,
)
from vllm.distributed.kv_transfer.kv_connector.v1.hisparse.stats import HiSparseKVConnectorStats
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_planning import get_global_kv_cache_groups, get_kv_cache_configs
from vllm.v1.core.kv_cache_utils import (
    generate_scheduler_kv_cache_config,
    get_request_block_hasher,
)
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import KVCacheSpec, MLAAttentionSpec, SparseCacheRole
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

# vllm_engine also sets vLLM's block-hash seed (init_none_hash) the drivers' hashers need
from tests.engines.vllm.vllm_engine import (
    capture_kv_events,
    model_dir,
    runner_output,
    sampled_tokens,
    step_with_batch_queue,
)

LAYERS = 2
BLOCK = 64  # tokens per page (FlashMLA-sparse's block size)
LATENT = 512 + 64  # MLA latent + rope dims per token per layer
INDEX_TOPK = 64
#: bytes of one top-k row the worker loads into a hot buffer on a miss (bf16 latent)
ROW_BYTES = LATENT * 2
MODEL_CONFIG = {
    "architectures": ["DeepseekV32ForCausalLM"], "model_type": "deepseek_v32",
    "hidden_size": 256, "intermediate_size": 512, "moe_intermediate_size": 128,
    "num_attention_heads": 4, "num_key_value_heads": 4, "num_hidden_layers": LAYERS,
    "kv_lora_rank": 512, "q_lora_rank": 128, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128,
    "v_head_dim": 128, "index_topk": INDEX_TOPK, "index_head_dim": 128, "index_n_heads": 4,
    "max_position_embeddings": 4096, "vocab_size": 1000, "torch_dtype": "bfloat16",
    "rms_norm_eps": 1e-6, "n_routed_experts": 4, "num_experts_per_tok": 2,
    "first_k_dense_replace": 2, "rope_theta": 10000.0,
}


def layer_specs() -> dict[str, KVCacheSpec]:
    """The specs a DeepSeek-V3.2 model runner reports per layer: the sparse MLA latent
    (the index-group leader) and the DSA indexer's key cache (128 fp8 + 4 scale bytes)."""
    specs: dict[str, KVCacheSpec] = {}
    for i in range(LAYERS):
        specs[f"model.layers.{i}.self_attn.attn"] = MLAAttentionSpec(
            block_size=BLOCK, num_kv_heads=1, head_size=LATENT, dtype=torch.bfloat16,
            topk_buffer_width=INDEX_TOPK, is_index_group_leader=True)
        specs[f"model.layers.{i}.self_attn.indexer.k_cache"] = MLAAttentionSpec(
            block_size=BLOCK, num_kv_heads=1, max_tp_shards=1, head_size=132,
            dtype=torch.uint8, cache_role=SparseCacheRole.INDEXER)
    return specs


def page_bytes() -> int:
    """Bytes of one host page: the latent of every sparse layer for one block."""
    return LAYERS * BLOCK * LATENT * 2


def name_hisparse_backend() -> None:
    """On vLLM 0.34+, make the CPU platform name vLLM's base HiSparse backend (no shared
    host pool); nothing on vLLM 0.33, which asks no platform."""
    try:
        from vllm.v1.hisparse.backend import HiSparseBackend
    except ImportError:
        return
    from vllm.platforms import current_platform

    qualname = f"{HiSparseBackend.__module__}.{HiSparseBackend.__qualname__}"
    current_platform.get_hisparse_backend_cls = lambda: qualname  # type: ignore[method-assign]


def build_hisparse_config(tmp_path: Path, *, host_blocks: int, max_model_len: int = 1024,
                          max_num_seqs: int = 16, max_num_batched_tokens: int = 2048,
                          tensor_parallel_size: int = 1, eager_host_mirror: bool = True,
                          async_scheduling: bool = False) -> VllmConfig:
    """The ``VllmConfig`` of a HiSparse engine whose host pool holds ``host_blocks``
    pages (``host_pool_gib`` = that many pages' bytes, as a user sizes it);
    ``async_scheduling``: vLLM's ``AsyncScheduler`` (a GPU engine's default)."""
    name_hisparse_backend()
    directory = model_dir(tmp_path, MODEL_CONFIG, "hisparse-model")
    model = ModelConfig(model=str(directory), dtype="bfloat16", skip_tokenizer_init=True,
                        max_model_len=max_model_len)
    config = VllmConfig(
        model_config=model,
        cache_config=CacheConfig(block_size=BLOCK, enable_prefix_caching=True),
        scheduler_config=SchedulerConfig(max_num_seqs=max_num_seqs,
                                         max_num_batched_tokens=max_num_batched_tokens,
                                         max_model_len=max_model_len,
                                         is_encoder_decoder=False,
                                         async_scheduling=async_scheduling),
        device_config=DeviceConfig(device="cpu"),
        parallel_config=ParallelConfig(tensor_parallel_size=tensor_parallel_size),
        kv_events_config=KVEventsConfig(enable_kv_cache_events=True, publisher="null"))
    # What a CUDA host's VllmConfig resolves (refused off CUDA, so set afterwards).
    host_pool_gib = (host_blocks * page_bytes() + page_bytes() // 2) / 2**30
    config.kv_transfer_config = KVTransferConfig(
        kv_connector="HiSparseConnector", kv_role="kv_both",
        kv_connector_extra_config={"host_pool_gib": host_pool_gib})
    config.attention_config.hisparse_config = HiSparseConfig(eager_host_mirror=eager_host_mirror)
    config.cache_config.kv_cache_layout = "BLHNC"
    config.scheduler_config.disable_hybrid_kv_cache_manager = False
    return config


def build_hisparse_scheduler(tmp_path: Path, *, gpu_blocks: int = 150, host_blocks: int = 29,
                             **config: Any) -> Scheduler:
    """A real vLLM 0.33 ``Scheduler`` with the real ``HiSparseConnector`` on CPU: the
    KV cache planned by vLLM (``--num-gpu-blocks-override gpu_blocks``), the scheduler's
    config derived as the engine core derives it."""
    vllm_config = build_hisparse_config(tmp_path, host_blocks=host_blocks, **config)
    specs = layer_specs()
    groups = get_global_kv_cache_groups(vllm_config, [specs])
    vllm_config.cache_config.num_gpu_blocks_override = gpu_blocks
    kv_cache_config = generate_scheduler_kv_cache_config(
        get_kv_cache_configs(vllm_config, [specs], [1 << 34], groups))
    if kv_cache_config.hisparse_host_num_blocks != host_blocks:
        raise AssertionError(f"vLLM sized the host pool at "
                             f"{kv_cache_config.hisparse_host_num_blocks}, wanted {host_blocks}")
    vllm_config.cache_config.num_gpu_blocks = kv_cache_config.num_blocks
    scheduler_cls = vllm_config.scheduler_config.get_scheduler_cls()  # as the engine core
    assert issubclass(scheduler_cls, Scheduler), scheduler_cls
    return scheduler_cls(vllm_config, kv_cache_config, StructuredOutputManager(vllm_config),
                         block_size=BLOCK, log_stats=True)


@dataclass
class Truth:
    """What vLLM itself said over a run."""

    writebacks: int = 0  # page transfers (restore=False) vLLM planned and completed
    restores: int = 0  # page transfers (restore=True)
    hot_hits: int = 0  # vLLM's kv_connector_stats, as vllm:hisparse_cache_hits adds them
    hot_misses: int = 0
    hot_bytes: int = 0
    prefix_queries: int = 0  # PrefixCacheStats
    prefix_hits: int = 0
    #: hit tokens of admitted requests whose pages vLLM left null in the resident row
    #: after its schedule() (read from the host pool), and those it gave a GPU copy
    host_served_hits: int = 0
    gpu_served_hits: int = 0
    mixed_hits: int = 0  # admitted requests with hit pages of both kinds
    waiting_with_host_full: int = 0  # steps where requests waited and vLLM's host usage was 1
    host_usage: float = 0.0  # vLLM's last vllm:hisparse_host_cache_usage_perc
    pending_transfers: int = 0  # vLLM's last vllm:hisparse_pending_page_transfers


class HiSparseDriver:
    """Drives a HiSparse ``Scheduler`` like vLLM's engine core, as the GPU workers reply.

    Args:
        scheduler: from :func:`build_hisparse_scheduler`.
        transfer_delay: steps between a page transfer's appearance in the connector
            metadata and the workers reporting it enqueued and completed.
        workers: TP workers; each reports every transfer (vLLM waits for all).
        seed: the hot-buffer hit / miss counts the workers report.
    """

    def __init__(self, scheduler: Scheduler, *, transfer_delay: int = 1, workers: int = 1,
                 seed: int = 0) -> None:
        self.scheduler = scheduler
        self.transfer_delay = transfer_delay
        self.workers = workers
        self.random = random.Random(seed)
        self.hasher = get_request_block_hasher(BLOCK, sha256)
        self.steps = 0
        self.truth = Truth()
        #: (due step, transfer id, restore) of planned page transfers not yet reported
        self.due: list[tuple[int, int, bool]] = []
        self.copies_due: list[int] = []
        self.kv_events: list[Any] = []
        capture_kv_events(scheduler, self.kv_events)
        #: batches in flight as vLLM's engine core keeps them (2 with async scheduling);
        #: launched, not yet processed, newest first
        self.batch_queue_size = scheduler.vllm_config.max_concurrent_batches
        self._batch_queue: deque[tuple[Any, ModelRunnerOutput, Callable[[], None]]] = deque()

    # -- vLLM objects ---------------------------------------------------------------------
    @property
    def coordinator(self) -> Any:
        """vLLM's ``HiSparseCoordinator``."""
        return cast(Any, self.scheduler.connector).connector_scheduler.coordinator

    @property
    def host_pool(self) -> Any:
        """The HiSparse host ``BlockPool``."""
        return self.coordinator.get_host_block_pool()

    @property
    def busy(self) -> bool:
        return bool(self.scheduler.has_requests() or self.due or self.copies_due
                    or self._batch_queue or self.coordinator.has_pending_work())

    # -- requests -------------------------------------------------------------------------
    def add(self, request_id: str, tokens: Sequence[int], max_tokens: int = 4) -> Request:
        """Add a request whose block hashes vLLM computes (``add_request``)."""
        req = Request(request_id, list(tokens), SamplingParams(max_tokens=max_tokens,
                                                               ignore_eos=True),
                      None, block_hasher=self.hasher)
        self.scheduler.add_request(req)
        return req

    # -- one step -------------------------------------------------------------------------
    def step(self) -> Any:
        """One engine step, ending with one ``update_from_output()``; returns vLLM's
        scheduler stats of it. With one batch in flight: ``schedule()``, the workers'
        reply, ``update_from_output()``; with async scheduling, as the engine core's batch
        queue (:func:`~tests.engines.vllm.vllm_engine.step_with_batch_queue`)."""
        return step_with_batch_queue(self.scheduler, self._batch_queue, self.batch_queue_size,
                                     self._launch, lambda launched: self._process(*launched))

    def _launch(self) -> tuple[Any, ModelRunnerOutput, Callable[[], None]]:
        """``schedule()``, and the workers' reply to the batch (synthesized now, handed
        over when the batch is processed) with what to note once vLLM has it."""
        out = self.scheduler.schedule()
        self._read_residency(out)
        meta = out.kv_connector_metadata
        command = getattr(meta, "command", None)
        for transfer in (command.page_transfers if command is not None else ()):
            self.due.append((self.steps + self.transfer_delay, transfer.transfer_id,
                             transfer.restore))
        self.copies_due.extend(copy.dst_block_id for copy in
                               getattr(meta, "host_block_copies", ()) or ())
        ids = list(out.num_scheduled_tokens)
        connector_output, delivered = self._worker_output(out)
        runner = runner_output(ids, [sampled_tokens(self.scheduler, out, r) for r in ids],
                               connector_output)
        return out, runner, delivered

    def _process(self, out: Any, runner: ModelRunnerOutput,
                 delivered: Callable[[], None]) -> Any:
        engine_outputs = self.scheduler.update_from_output(out, runner)
        delivered()
        self.steps += 1
        return self._read_stats(engine_outputs)

    def run(self, max_steps: int = 400) -> int:
        """Step until nothing is left; return the steps taken."""
        taken = 0
        while self.busy and taken < max_steps:
            self.step()
            taken += 1
        return taken

    def _read_residency(self, out: Any) -> None:
        """Which hit pages of each admitted request vLLM's resident row reads from GPU
        copies and which from the host pool (null pages), as ``schedule()`` left them."""
        managers = self.coordinator.resident_managers
        for new in out.scheduled_new_reqs:
            if self.scheduler.requests[new.req_id].num_preemptions:
                continue  # a re-admission: not a lookup vLLM's hit rate counts
            pages = new.num_computed_tokens // BLOCK
            row = managers[0].get_residency_row(new.req_id)[:pages]
            host = sum(1 for block in row if block.is_null)
            self.truth.mixed_hits += 0 < host < pages
            self.truth.host_served_hits += host * BLOCK
            self.truth.gpu_served_hits += (pages - host) * BLOCK

    def _worker_output(self, out: Any) -> tuple[KVConnectorOutput, Callable[[], None]]:
        ready = [d for d in self.due if d[0] <= self.steps]
        self.due = [d for d in self.due if d[0] > self.steps]
        copies, self.copies_due = tuple(self.copies_due), []
        merged: Any = None
        for _ in range(self.workers):
            meta = HiSparseConnectorWorkerMetadata(
                enqueued_transfer_counts={tid: 1 for _, tid, _ in ready},
                completed_transfer_counts={tid: 1 for _, tid, _ in ready},
                completed_host_copy_dst_ids=copies)
            merged = meta if merged is None else merged.aggregate(meta)
        def delivered() -> None:  # vLLM has the reports: the transfers are done
            for _, _, restore in ready:
                if restore:
                    self.truth.restores += 1
                else:
                    self.truth.writebacks += 1

        stats = HiSparseKVConnectorStats()
        decoding = [r for r in out.num_scheduled_tokens
                    if self.scheduler.requests[r].num_computed_tokens
                    >= self.scheduler.requests[r].num_prompt_tokens]
        for _ in decoding:  # one device counter snapshot per decoding request
            misses = self.random.randrange(0, INDEX_TOPK // 4)
            stats.record_snapshot(INDEX_TOPK - misses, misses, misses * ROW_BYTES)
        nothing = not ready and not copies
        return KVConnectorOutput(
            kv_connector_worker_meta=None if nothing else merged,
            kv_connector_stats=None if stats.is_empty() else stats), delivered

    def _read_stats(self, engine_outputs: Any) -> Any:
        stats = None
        for outputs in engine_outputs.values():
            if outputs.scheduler_stats is not None:
                stats = outputs.scheduler_stats
        if stats is None:
            return None
        prefix = stats.prefix_cache_stats
        if prefix is not None:
            self.truth.prefix_queries += prefix.queries
            self.truth.prefix_hits += prefix.hits
        data = stats.kv_connector_stats or {}  # HiSparseKVConnectorStats.to_dict(): its data
        self.truth.hot_hits += sum(data.get("cache_hits", ()))
        self.truth.hot_misses += sum(data.get("cache_misses", ()))
        self.truth.hot_bytes += sum(data.get("host_to_device_bytes", ()))
        if data.get("host_cache_usage_perc"):
            self.truth.host_usage = data["host_cache_usage_perc"][-1]
            self.truth.pending_transfers = data["pending_page_transfers"][-1]
            if stats.num_waiting_reqs and self.truth.host_usage >= 1.0:
                self.truth.waiting_with_host_full += 1
        return stats

    # -- vLLM's own accounts --------------------------------------------------------------
    def host_events(self) -> tuple[int, int]:
        """``(stored, removed)`` host pages from vLLM's KV events with medium ``CPU``."""
        stored = removed = 0
        for event in self.kv_events:
            if getattr(event, "medium", None) != "CPU":
                continue
            if type(event).__name__ == "BlockStored":
                stored += len(event.block_hashes)
            elif type(event).__name__ == "BlockRemoved":
                removed += len(event.block_hashes)
        return stored, removed

    def host_state(self) -> tuple[int, int]:
        """Host ``(in_use, cached)`` from vLLM's own figures: in use = capacity x vLLM's
        usage (``get_usage``, which counts evictable cached blocks as free); cached =
        pages vLLM's CPU-medium KV events stored and did not remove, less those in use."""
        pool = self.host_pool
        in_use = round(pool.get_usage() * (pool.num_gpu_blocks - 1))
        stored, removed = self.host_events()
        published_in_use = sum(1 for b in pool.blocks
                               if b.block_hash is not None and b.ref_cnt and not b.is_null)
        return in_use, stored - removed - published_in_use
