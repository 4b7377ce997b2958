"""A real vLLM 0.33 engine loop on CPU: a real ``Scheduler`` with the real
``OffloadingConnector``, driven step by step with the worker outputs a GPU worker sends.

Nothing here is mocked on the scheduler side: requests go through vLLM's own
``add_request`` / ``schedule()`` / ``update_from_output()``. What is synthesized is the
worker side (no model runs): one sampled token per scheduled request, and the
``OffloadingWorkerMetadata`` that reports the store / load jobs of
``scheduler_output.kv_connector_metadata`` as completed, optionally ``delay`` steps later,
with ``TransferStats`` bytes and times as vLLM's CPU worker reports them.

Example::

    scheduler = build_scheduler(tmp_path, gpu_blocks=64, cpu_bytes=1 << 22)
    driver = EngineDriver(scheduler, transfer_delay=2)
    driver.add("conv-0", list(range(100)), max_tokens=4)
    while driver.busy:
        driver.step()
    driver.truth()              # {"gpu": (in_use, cached), "host": (in_use, cached)}
    driver.vllm_store_bytes     # what vLLM's connector stats counted
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, TypeVar, cast

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
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
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (
    OffloadingWorkerMetadata,
    TransferStats,
)
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import (
    BlockHash,
    get_request_block_hasher,
    init_none_hash,
    maybe_convert_block_hash,
)
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheSpec,
    MLAAttentionSpec,
    SlidingWindowSpec,
)
from vllm.v1.kv_offload.base import get_offload_block_hash
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

LAYERS = 2
KV_HEADS = 2
HEAD_DIM = 64
SLIDING_WINDOW = 64
MAX_MODEL_LEN = 4096
#: A small Llama layout; vLLM reads only this file (no weights, no tokenizer).
MODEL_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
    "intermediate_size": 512, "num_attention_heads": 4, "num_key_value_heads": KV_HEADS,
    "num_hidden_layers": LAYERS, "head_dim": HEAD_DIM, "max_position_embeddings": MAX_MODEL_LEN,
    "vocab_size": 1000, "torch_dtype": "float16", "rms_norm_eps": 1e-5,
}
init_none_hash(sha256)


def model_dir(tmp_path: Path, config: dict[str, Any] = MODEL_CONFIG,
              name: str = "model") -> Path:
    """A model directory holding only ``config.json`` (``config``)."""
    directory = Path(tmp_path) / name
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def capture_kv_events(scheduler: Scheduler, events: list[Any]) -> None:
    """Append every KV cache event ``scheduler`` publishes (once per step) to ``events``,
    still publishing them (needs ``kv_events``: publisher ``null``)."""
    publisher: Any = scheduler.kv_event_publisher
    publish = publisher.publish

    def capture(batch: Any) -> None:
        events.extend(batch.events)
        publish(batch)

    publisher.publish = capture


#: vLLM's two ways of scheduling, for tests that run under both: one batch in flight
#: (``Scheduler``), and async scheduling, a GPU engine's default (``AsyncScheduler``, two
#: batches in flight; with a KV connector a finished request's frees wait for its last
#: batch: ``pop_blocks_for_free``)
SCHEDULING = pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])

#: The token the synthetic model runner samples (and the last one of a request that
#: stops by itself: :meth:`EngineDriver.request`).
SAMPLED_TOKEN, STOP_TOKEN = 7, 9


#: vLLM 0.33's ``ModelRunnerOutput`` also takes each request's row (0.34 dropped it).
_ROWS = "req_id_to_index" in {f.name for f in dataclasses.fields(ModelRunnerOutput)}


def runner_output(ids: list[str], sampled: list[list[int]],
                  connector_output: Any = None) -> ModelRunnerOutput:
    """What the model runner returns for the batch ``ids`` (``sampled``: their tokens), as
    this vLLM release's ``ModelRunnerOutput`` takes it."""
    rows = {"req_id_to_index": {r: i for i, r in enumerate(ids)}} if _ROWS else {}
    return ModelRunnerOutput(req_ids=ids, sampled_token_ids=sampled,
                             kv_connector_output=connector_output, **rows)


def gpu_block_ids(spec: Any, tensors: Sequence[torch.Tensor]) -> list[int]:
    """The GPU blocks of a transfer's GPU side, as an ``OffloadingWorker`` gets it: vLLM
    0.33's ``GPULoadStoreSpec`` names them; 0.34's ``DevicePointers`` point at their rows
    (base + block id x row bytes, group by group and data ref by data ref: the first data
    ref's pointers, against whichever of ``tensors`` holds them)."""
    ids = getattr(spec, "block_ids", None)
    if ids is not None:
        return [int(i) for i in ids]
    pointers = [int(p) for p in spec.ptrs[:spec.group_block_counts[0]]]
    for tensor in tensors:
        base, row = tensor.data_ptr(), tensor.stride(0) * tensor.element_size()
        if pointers and base <= pointers[0] < base + tensor.shape[0] * row:
            return [(p - base) // row for p in pointers]
    raise ValueError("the transfer's device pointers are in none of the GPU tensors")


def sampled_tokens(scheduler: Scheduler, out: Any, req_id: str) -> list[int]:
    """What a model runner samples for ``req_id`` in the step of ``out``, called right after
    the ``schedule()`` that made it: one token once its prompt is computed, nothing for a
    partial prefill (vLLM's ``is_prefill_chunk``, which that call set)."""
    return [] if scheduler.requests[req_id].is_prefill_chunk else [SAMPLED_TOKEN]


def layer_specs(kind: str = "full", block_size: int = 16,
                layers: int = LAYERS) -> dict[str, KVCacheSpec]:
    """Per-layer KV cache specs as a model runner reports them.

    ``kind``: ``full`` (every layer full attention), ``hybrid`` (even layers full, odd
    layers sliding window), ``mla`` (one latent per token per layer: 512 + 64 dims).
    """
    specs: dict[str, KVCacheSpec] = {}
    for i in range(layers):
        name = f"model.layers.{i}.self_attn.attn"
        if kind == "mla":
            specs[name] = MLAAttentionSpec(block_size=block_size, num_kv_heads=1,
                                           head_size=576, dtype=torch.float16)
        elif kind == "hybrid" and i % 2:
            specs[name] = SlidingWindowSpec(block_size=block_size, num_kv_heads=KV_HEADS,
                                            head_size=HEAD_DIM, dtype=torch.float16,
                                            sliding_window=SLIDING_WINDOW)
        else:
            specs[name] = FullAttentionSpec(block_size=block_size, num_kv_heads=KV_HEADS,
                                            head_size=HEAD_DIM, dtype=torch.float16)
    return specs


def plan_kv_cache(vllm_config: VllmConfig, specs: dict[str, KVCacheSpec],
                  gpu_blocks: int) -> KVCacheConfig:
    """vLLM's own planner: the ``KVCacheConfig`` of a pool of ``gpu_blocks`` blocks
    (tensors, groups and their shared backing allocation as vLLM lays them out), sized
    with ``num_gpu_blocks_override`` as ``--num-gpu-blocks-override`` does."""
    from vllm.v1.core.kv_cache_planning import get_global_kv_cache_groups, get_kv_cache_configs

    if vllm_config.cache_config.kv_cache_layout is None:  # the engine core resolves it
        vllm_config.cache_config.kv_cache_layout = "LBNHC"
    groups = get_global_kv_cache_groups(vllm_config, [specs])
    cache = vllm_config.cache_config
    saved, cache.num_gpu_blocks_override = cache.num_gpu_blocks_override, gpu_blocks
    try:  # memory for max_model_len passes vLLM's check; the override sizes the pool
        config = get_kv_cache_configs(vllm_config, [specs], [1 << 34], groups)[0]
    finally:
        cache.num_gpu_blocks_override = saved
    if config.num_blocks != gpu_blocks:
        raise AssertionError(f"planner gave {config.num_blocks} blocks, wanted {gpu_blocks}")
    return config


def build_vllm_config(tmp_path: Path, *, cpu_bytes: int | None, block_size: int = 16,
                      blocks_per_chunk: int = 1, kv_events: bool = False,
                      max_num_seqs: int = 64, max_num_batched_tokens: int = 2048,
                      prefix_caching: bool = True,
                      max_model_len: int = MAX_MODEL_LEN, hybrid: bool = False,
                      tensor_parallel_size: int = 1,
                      async_scheduling: bool = False) -> VllmConfig:
    """The ``VllmConfig`` of a CPU scheduler; ``cpu_bytes`` None = no offloading."""
    model = ModelConfig(model=str(model_dir(tmp_path)), dtype="float16",
                        skip_tokenizer_init=True, max_model_len=max_model_len)
    cache = CacheConfig(block_size=block_size, enable_prefix_caching=prefix_caching)
    scheduler = SchedulerConfig(max_num_seqs=max_num_seqs,
                                max_num_batched_tokens=max_num_batched_tokens,
                                max_model_len=max_model_len, is_encoder_decoder=False,
                                async_scheduling=async_scheduling)
    transfer = None
    if cpu_bytes is not None:
        extra: dict[str, Any] = {"cpu_bytes_to_use": cpu_bytes}
        if blocks_per_chunk != 1:
            extra["block_size"] = block_size * blocks_per_chunk
        transfer = KVTransferConfig(kv_connector="OffloadingConnector", kv_role="kv_both",
                                    kv_connector_extra_config=extra)
    events = KVEventsConfig(enable_kv_cache_events=True, publisher="null") if kv_events \
        else None
    with _hybrid_allowed(hybrid):
        return VllmConfig(model_config=model, cache_config=cache, scheduler_config=scheduler,
                          device_config=DeviceConfig(device="cpu"),
                          parallel_config=ParallelConfig(
                              tensor_parallel_size=tensor_parallel_size),
                          kv_transfer_config=transfer, kv_events_config=events)


@contextmanager
def _hybrid_allowed(hybrid: bool) -> Iterator[None]:
    """vLLM turns its hybrid allocator off on non-GPU platforms; a hybrid test bed lets
    it on (the scheduler side is platform-independent) so full and sliding-window layers
    get their own KV cache groups, as on a GPU."""
    if not hybrid:
        yield
        return
    from vllm.platforms import current_platform

    platform: Any = type(current_platform)
    saved = platform.__dict__.get("support_hybrid_kv_cache")
    platform.support_hybrid_kv_cache = classmethod(lambda cls: True)
    try:
        yield
    finally:
        if saved is None:
            del platform.support_hybrid_kv_cache
        else:
            platform.support_hybrid_kv_cache = saved


def build_scheduler(tmp_path: Path, *, gpu_blocks: int = 200, cpu_bytes: int | None = 1 << 22,
                    block_size: int = 16, blocks_per_chunk: int = 1, hybrid: bool = False,
                    kv_events: bool = True, max_num_seqs: int = 64,
                    max_num_batched_tokens: int = 2048,
                    tensor_parallel_size: int = 1, async_scheduling: bool = False) -> Scheduler:
    """A real vLLM 0.33 ``Scheduler`` on CPU, prefix caching and stats on.

    Args:
        tmp_path: where the model directory (a ``config.json``) is written.
        gpu_blocks: blocks of the GPU pool (including vLLM's null block).
        cpu_bytes: ``cpu_bytes_to_use`` of the ``OffloadingConnector`` (None: no connector).
        block_size: tokens per GPU block; ``blocks_per_chunk`` GPU blocks per host chunk.
        hybrid: full-attention + sliding-window layers (two KV cache groups).
        kv_events: enable vLLM's KV cache events (publisher ``null``; the driver keeps
            what vLLM publishes in :attr:`EngineDriver.kv_events`).
        tensor_parallel_size: TP workers the connector waits for per job (drive it with
            ``EngineDriver(workers=tensor_parallel_size)``).
        async_scheduling: vLLM's async scheduling, on by default in a GPU engine (the
            ``AsyncScheduler``, two batches in flight: :class:`EngineDriver` then drives it
            as the engine core's batch queue does; with the connector, vLLM defers a
            finished request's frees until its last batch is processed).
    """
    groups = 2 if hybrid else 1  # vLLM checks that one request of max_model_len fits
    max_model_len = min(MAX_MODEL_LEN, (gpu_blocks // groups - 1) * block_size)
    vllm_config = build_vllm_config(tmp_path, cpu_bytes=cpu_bytes, block_size=block_size,
                                    blocks_per_chunk=blocks_per_chunk, kv_events=kv_events,
                                    max_num_seqs=max_num_seqs,
                                    max_num_batched_tokens=max_num_batched_tokens,
                                    tensor_parallel_size=tensor_parallel_size, hybrid=hybrid,
                                    max_model_len=max_model_len,
                                    async_scheduling=async_scheduling)
    specs = layer_specs("hybrid" if hybrid else "full", block_size)
    kv_cache_config = plan_kv_cache(vllm_config, specs, gpu_blocks)
    vllm_config.cache_config.num_gpu_blocks = gpu_blocks
    # the class vLLM's engine core builds for this config (AsyncScheduler with async
    # scheduling)
    scheduler_cls = vllm_config.scheduler_config.get_scheduler_cls()
    assert issubclass(scheduler_cls, Scheduler), scheduler_cls
    return scheduler_cls(vllm_config, kv_cache_config, StructuredOutputManager(vllm_config),
                         block_size=block_size, log_stats=True)


@dataclass
class StepRecord:
    """What one engine step did, as vLLM reported it."""

    scheduler_output: Any
    engine_outputs: Any
    stats: Any  # SchedulerStats (log_stats=True)
    store_jobs: list[int] = field(default_factory=list)
    load_jobs: list[int] = field(default_factory=list)


L = TypeVar("L", bound=tuple[Any, ...])
R = TypeVar("R")


def step_with_batch_queue(scheduler: Scheduler, queue: deque[L], size: int,
                          launch: Callable[[], L], process: Callable[[L], R]) -> R:
    """One engine step, ending with one processed batch, as vLLM's engine core makes it.

    With one batch in flight (``size`` 1): ``launch()`` (``schedule()`` and the model's
    work on its output) then ``process()`` (``update_from_output()``). With a batch queue
    of ``size`` (async scheduling), as ``EngineCore.step_with_batch_queue`` does: the next
    batch is launched while there is room and work (a launch's first item is its
    ``SchedulerOutput``), and the oldest one is processed once the queue is full or
    nothing more can be scheduled; calls are made until one batch is processed. With no
    work and nothing in flight a batch is launched and processed anyway (an idle step:
    the test beds step an idle engine to deliver the workers' last reports)."""
    if size <= 1:
        return process(launch())
    while True:
        if scheduler.has_requests() or not queue:
            launched = launch()
            queue.appendleft(launched)
            executed = launched[0].total_num_scheduled_tokens > 0
            if len(queue) < size and (executed or scheduler.has_requests()):
                continue
        return process(queue.pop())


class _Launched(NamedTuple):
    """A batch scheduled and run by the (synthetic) workers, its output not yet processed."""

    scheduler_output: Any
    runner_output: ModelRunnerOutput
    store_jobs: list[int]
    load_jobs: list[int]
    delivered: Callable[[], None]  # what the driver notes once vLLM has the output
    ready_at: float  # perf_counter() when its forward pass is done (0: no model time)


def _nothing() -> None:
    pass


class EngineDriver:
    """Drives a real ``Scheduler`` like vLLM's engine core, synthesizing worker outputs.

    Args:
        scheduler: from :func:`build_scheduler`.
        transfer_delay: steps between a job's appearance in the connector metadata and
            the worker reporting it complete (0: the same step, like a sync worker).
        workers: TP workers; each reports every job and its share of the bytes.
        worker_lag: worker ``i`` reports each job ``i * worker_lag`` steps after worker 0
            (vLLM completes a job once every worker has reported it).
        seconds_per_byte: transfer time the synthetic worker reports.
        keep_history: keep every step's :class:`StepRecord` in ``history`` (benchmarks
            turn it off).
        model_seconds: how long the synthetic model runs for a ``SchedulerOutput``
            (busy-waited before its ``update_from_output()``; batches run one after
            another, each from its ``schedule()`` or the previous one's end, whichever
            comes later); None: no wait.

    Truth accumulated from vLLM itself: ``prefix_queries`` / ``prefix_hits`` (its
    ``PrefixCacheStats``), ``connector_queries`` / ``connector_hits`` (the connector's
    prefix-cache stats: host hits), ``vllm_store_bytes`` / ``vllm_load_bytes`` (its
    ``OffloadingConnectorStats``), ``vllm_tiering`` (its tiering manager's counters,
    ``vllm:kv_offload_tiering_*`` summed over tiers), ``kv_events`` (every
    ``BlockStored`` / ``BlockRemoved`` vLLM published), and the host blocks' stays from
    those events and vLLM's load jobs (:meth:`_observe_host_stays`,
    :meth:`_observe_host_load`): ``host_onloads``
    (chunks loaded back while stored), ``host_reused`` (stays with a load),
    ``host_evicted_unused`` (stays removed with none), and in steps (the step a stay
    began, its last use): ``host_residency`` (the length of each ended stay) and
    ``host_reuse_gaps`` (steps from a stay's start or last load to each load).
    """

    def __init__(self, scheduler: Scheduler, *, transfer_delay: int = 0, workers: int = 1,
                 worker_lag: int = 0, seconds_per_byte: float = 1e-10,
                 keep_history: bool = True,
                 model_seconds: Callable[[Any], float] | None = None) -> None:
        self.scheduler = scheduler
        self.transfer_delay = transfer_delay
        self.workers = workers
        self.worker_lag = worker_lag
        self.keep_history = keep_history
        self.seconds_per_byte = seconds_per_byte
        self.model_seconds = model_seconds
        self.block_size = scheduler.block_size
        self.hasher = get_request_block_hasher(self.block_size, sha256)
        self.steps = 0
        #: batches in flight, as vLLM's engine core keeps them (``max_concurrent_batches``:
        #: 2 with async scheduling); launched, not yet processed, newest first
        self.batch_queue_size = scheduler.vllm_config.max_concurrent_batches
        self._batch_queue: deque[_Launched] = deque()
        #: requests that stop by themselves: output tokens left to sample
        self._stops: dict[str, int] = {}
        self._model_free_at = 0.0  # when the last batch's forward pass is done
        self.scheduler_seconds = 0.0  # inside schedule() + update_from_output() only
        self.scheduler_cpu_seconds = 0.0  # the same, CPU time of this thread
        # (due step, worker, job id, is_store, bytes, request id of an async load or None)
        self.due: list[tuple[int, int, int, bool, int, str | None]] = []
        self.prefix_queries = 0
        self.prefix_hits = 0
        self.preempted_queries = 0
        self.preempted_requests = 0
        self.preempted_hits = 0            # vLLM's GPU hits of those re-lookups
        self.connector_preempted_hits = 0  # and the connector's (host) hits
        self.connector_queries = 0
        self.connector_hits = 0
        self.vllm_store_bytes = 0
        self.vllm_load_bytes = 0
        self.vllm_store_time = 0.0
        self.vllm_load_time = 0.0
        self.vllm_tiering: dict[str, float] = {}  # vllm:kv_offload_tiering_* counters
        self.vllm_allocation_failures = 0  # vllm:kv_offload_allocation_failure
        self.reported_store_bytes = 0
        self.reported_load_bytes = 0
        self.kv_events: list[Any] = []
        #: CPU block hash -> (step stored, step last used, loaded back since stored)
        self.host_stays: dict[Any, tuple[int, int, bool]] = {}
        self.host_residency: list[int] = []
        self.host_reuse_gaps: list[int] = []
        self.host_onloads = 0
        self.host_reused = 0
        self.host_evicted_unused = 0
        self._events_seen = 0
        #: GPU blocks that became held by some request (vLLM's per-request block tables,
        #: read after each schedule() and update_from_output(); the null block left out)
        self.blocks_taken = 0
        self._held: set[tuple[int, int]] = set()
        #: jobs of vLLM's connector metadata every worker has reported, by ``is_store``
        #: (vLLM completes each, unless a cache reset made it stale)
        self.jobs_reported = {True: 0, False: 0}
        #: jobs the workers have not all reported: ``job_id -> (is_store, chunk ids)``
        self.in_flight: dict[int, tuple[bool, frozenset[int]]] = {}
        self.history: list[StepRecord] = []
        capture_kv_events(scheduler, self.kv_events)
        #: vLLM emits no CPU events when its offloading manager resets, so the driver
        #: notes where the last reset came in :attr:`kv_events`, and the net chunks of
        #: the manager's own events still queued then (published after it, from before it)
        self.host_reset_at, self.host_queued_at_reset = 0, 0
        manager = self.offloading_manager
        if manager is not None:
            reset = manager.reset_cache

            @functools.wraps(reset)
            def reset_cache(*args: Any, **kwargs: Any) -> Any:
                queued = sum(-len(e.keys) if e.removed else len(e.keys)
                             for e in manager.events or () if not e.metadata_only)
                result = reset(*args, **kwargs)
                self.host_reset_at, self.host_queued_at_reset = len(self.kv_events), queued
                return result

            manager.reset_cache = reset_cache

    # -- requests -------------------------------------------------------------------------
    def request(self, request_id: str, tokens: Sequence[int], max_tokens: int = 4,
                stops: bool = False) -> Request:
        """A request whose block hashes vLLM computes, ending at ``max_tokens`` output
        tokens: at its length limit, which vLLM's scheduler sees coming, or (``stops``) by
        sampling a stop token there, as a model that has answered, which vLLM learns only
        from the batch's output (the driver samples :data:`STOP_TOKEN` as its last)."""
        if stops:
            self._stops[request_id] = max_tokens
            params = SamplingParams(max_tokens=max_tokens + 16, stop_token_ids=[STOP_TOKEN])
        else:
            params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
        return Request(request_id, list(tokens), params, None, block_hasher=self.hasher)

    def add(self, request_id: str, tokens: Sequence[int], max_tokens: int = 4,
            stops: bool = False) -> Request:
        """Add a request to the scheduler (``add_request``); see :meth:`request`."""
        req = self.request(request_id, tokens, max_tokens, stops)
        self.scheduler.add_request(req)
        return req

    @property
    def busy(self) -> bool:
        """Requests left, or transfers the worker has not reported yet."""
        return bool(self.scheduler.has_requests() or self.due or self._batch_queue
                    or self._connector_busy())

    def _connector_busy(self) -> bool:
        side = self.connector_scheduler
        return bool(side is not None and side.has_pending_push_work())

    # -- vLLM objects ---------------------------------------------------------------------
    @property
    def block_pool(self) -> Any:
        """The GPU ``BlockPool``."""
        return self.scheduler.kv_cache_manager.block_pool

    @property
    def connector_scheduler(self) -> Any:
        """The ``OffloadingConnectorScheduler`` (None without offloading)."""
        connector = self.scheduler.connector
        return getattr(connector, "connector_scheduler", None) if connector else None

    @property
    def offloading_manager(self) -> Any:
        """The ``CPUOffloadingManager`` (None without offloading)."""
        side = self.connector_scheduler
        return side.manager if side is not None else None

    # -- one step -------------------------------------------------------------------------
    def step(self) -> StepRecord:
        """One engine step, ending with one ``update_from_output()``.

        ``schedule()``, a synthesized model-runner output, ``update_from_output()``; with
        vLLM's ``AsyncScheduler`` (:attr:`batch_queue_size` batches in flight) as the
        engine core's batch queue makes them (:func:`step_with_batch_queue`). The output
        of a batch is what the workers made of it, so it is synthesized right after its
        ``schedule()`` (its sampled tokens and the transfer jobs the workers report with
        it) and handed over when the batch is processed.
        """
        return step_with_batch_queue(self.scheduler, self._batch_queue, self.batch_queue_size,
                                     self._launch, self._process)

    def _launch(self) -> _Launched:
        """``schedule()``; the batch's model-runner output as the workers make it, and
        the store / load jobs its connector metadata started."""
        started, cpu = time.perf_counter(), time.thread_time()
        out = self.scheduler.schedule()
        self.scheduler_seconds += time.perf_counter() - started
        self.scheduler_cpu_seconds += time.thread_time() - cpu
        self.observe_block_tables()
        ready_at = 0.0
        if self.model_seconds is not None:  # the forward pass: batches run one at a time
            ready_at = max(time.perf_counter(), self._model_free_at) + self.model_seconds(out)
            self._model_free_at = ready_at
        meta = out.kv_connector_metadata
        stores = list(getattr(meta, "store_jobs", {}) or {})
        loads = list(getattr(meta, "load_jobs", {}) or {})
        for job_id in stores:
            self._submit(job_id, True, meta.store_jobs[job_id], self.transfer_delay)
        for job_id in loads:
            job = meta.load_jobs[job_id]
            # A sync load completes before this step's forward pass; an async one later.
            self._submit(job_id, False, job, 0 if job.sync else self.transfer_delay)
        connector_output, delivered = None, _nothing
        if self.connector_scheduler is not None:
            worker_meta, loaded, delivered = self._worker_meta()
            connector_output = KVConnectorOutput(finished_recving=loaded or None,
                                                 kv_connector_worker_meta=worker_meta)
        ids = list(out.num_scheduled_tokens)
        runner = runner_output(ids, [self._sample(out, r) for r in ids], connector_output)
        return _Launched(out, runner, stores, loads, delivered, ready_at)

    def _sample(self, out: Any, req_id: str) -> list[int]:
        """The tokens the model samples for ``req_id`` in the batch of ``out``; a request
        that stops by itself samples :data:`STOP_TOKEN` as its last."""
        tokens = sampled_tokens(self.scheduler, out, req_id)
        left = self._stops.get(req_id)
        if tokens and left is not None:
            if left > 1:
                self._stops[req_id] = left - 1
            else:
                del self._stops[req_id]
                tokens = [STOP_TOKEN]
        return tokens

    def _process(self, launched: _Launched) -> StepRecord:
        """``update_from_output()`` of a launched batch, and what the step did."""
        out, runner_output, stores, loads, delivered, ready_at = launched
        while time.perf_counter() < ready_at:  # its forward pass, as a busy wait
            pass
        started, cpu = time.perf_counter(), time.thread_time()
        engine_outputs = self.scheduler.update_from_output(out, runner_output)
        self.scheduler_seconds += time.perf_counter() - started
        self.scheduler_cpu_seconds += time.thread_time() - cpu
        delivered()
        stats = self._read_stats(engine_outputs)
        self.observe_block_tables()
        self._observe_host_stays()
        self.steps += 1
        record = StepRecord(out, engine_outputs, stats, stores, loads)
        if self.keep_history:
            self.history.append(record)
        return record

    def run(self, max_steps: int = 500) -> int:
        """Step until nothing is left; return the steps taken."""
        taken = 0
        while self.busy and taken < max_steps:
            self.step()
            taken += 1
        return taken

    def observe_block_tables(self) -> None:
        """Count the GPU blocks that became held since the last look, from vLLM's own
        per-request block tables (a block taken and released between two looks, within
        one ``schedule()``, is missed: tests that preempt do not use this figure)."""
        held: set[tuple[int, int]] = set()
        managers = self.scheduler.kv_cache_manager.coordinator.single_type_managers
        for group, manager in enumerate(managers):
            for blocks in manager.req_to_blocks.values():
                held.update((group, b.block_id) for b in blocks if not b.is_null)
        self.blocks_taken += len(held - self._held)
        self._held = held

    def _job_bytes(self, job: Any, is_store: bool) -> int:
        spec = job.dst_spec if is_store else job.src_spec  # the CPU side, in chunks
        chunks = len(getattr(spec, "block_ids", ()))
        side = self.connector_scheduler
        chunk_bytes = 0
        if side is not None:
            info = dict(side.manager.config_info()[0]) if side.manager.config_info() else {}
            num, size = info.get("cpu_num_chunks", 0), info.get("cpu_kv_cache_size_bytes", 0)
            chunk_bytes = size // num if num else 0
        return chunks * chunk_bytes

    def _observe_host_load(self, load_job: int) -> None:
        """A block's stay in host memory (:meth:`_observe_host_stays`) is loaded back when a
        load job vLLM's connector scheduler created covers its offload key
        (``TransferJobStatus.keys``, named in events by vLLM's own
        ``get_offload_block_hash`` / ``maybe_convert_block_hash``); called as each load is
        submitted, after ``schedule()``."""
        stays, now = self.host_stays, self.steps
        for key in self.connector_scheduler._jobs[load_job].keys:
            block = maybe_convert_block_hash(BlockHash(get_offload_block_hash(key)))
            stay = stays.get(block)
            if stay is not None:
                born, used, reused = stay
                self.host_onloads += 1
                self.host_reuse_gaps.append(now - used)
                self.host_reused += not reused
                stays[block] = (born, now, True)

    def _observe_host_stays(self) -> None:
        """A block's stay in host memory as vLLM tells it: from its CPU-medium
        ``BlockStored`` event to its ``BlockRemoved`` (``AllBlocksCleared``: every stay
        ends). Called after ``update_from_output()`` for that step's events, after the
        step's loads (:meth:`_observe_host_load`): a chunk being loaded is pinned, so no
        event of the same step can end its stay first."""
        stays, now = self.host_stays, self.steps
        for event in self.kv_events[self._events_seen:]:
            kind = type(event).__name__
            if kind == "AllBlocksCleared":
                stays.clear()
            elif getattr(event, "medium", None) == "CPU":
                for block in event.block_hashes:
                    if kind == "BlockStored":
                        stays[block] = (now, now, False)
                    elif kind == "BlockRemoved" and block in stays:
                        born, _, reused = stays.pop(block)
                        self.host_evicted_unused += not reused
                        self.host_residency.append(now - born)
        self._events_seen = len(self.kv_events)

    def _submit(self, job_id: int, is_store: bool, job: Any, delay: int) -> None:
        if not is_store and self.scheduler.kv_event_publisher is not None:
            self._observe_host_load(job_id)
        spec = job.dst_spec if is_store else job.src_spec  # the CPU side: chunk ids
        self.in_flight[job_id] = (is_store, frozenset(int(i) for i in spec.block_ids))
        share = self._job_bytes(job, is_store) // self.workers  # each worker moves its shard
        req = None if is_store or job.sync else job.req_id
        for worker in range(self.workers):
            self.due.append((self.steps + delay + worker * self.worker_lag, worker, job_id,
                             is_store, share, req))

    def _worker_meta(self) -> tuple[OffloadingWorkerMetadata | None, set[str],
                                    Callable[[], None]]:
        """What the workers report this step, aggregated as the engine core does, the
        requests whose async loads every worker finished (``finished_recving``), and what
        to note once vLLM has received the reports (with its batch's output: jobs done,
        bytes reported).
        A worker with no job completed reports no metadata (vLLM's
        ``build_connector_worker_meta`` returns None), so a step where no worker completed
        one carries none."""
        ready = [d for d in self.due if d[0] <= self.steps]
        self.due = [d for d in self.due if d[0] > self.steps]
        pending = {d[2] for d in self.due}
        reported = {d[2] for d in ready} - pending  # jobs every worker has now reported
        merged = OffloadingWorkerMetadata()
        for worker in range(self.workers):
            stats = TransferStats()
            completed = {}
            for _, w, job_id, is_store, share, _ in ready:
                if w != worker:
                    continue
                side = stats.store if is_store else stats.load
                side.record(share, share * self.seconds_per_byte)
                completed[job_id] = 1
            meta = OffloadingWorkerMetadata(completed_jobs=completed, transfer_stats=stats)
            merged = cast(OffloadingWorkerMetadata, merged.aggregate(meta))
        still_loading = {d[5] for d in self.due}
        loaded = {d[5] for d in ready if d[5] is not None and d[5] not in still_loading}

        def delivered() -> None:  # vLLM got the reports: the jobs are done as it sees them
            for _, _, _, is_store, share, _ in ready:
                if is_store:
                    self.reported_store_bytes += share
                else:
                    self.reported_load_bytes += share
            for job_id in reported:
                job = self.in_flight.pop(job_id, None)
                if job is not None:
                    self.jobs_reported[job[0]] += 1

        return (merged if ready else None), loaded, delivered

    def _read_stats(self, engine_outputs: Any) -> Any:
        stats = None
        for outputs in engine_outputs.values():
            if outputs.scheduler_stats is not None:
                stats = outputs.scheduler_stats
        if stats is None:
            return None
        prefix = stats.prefix_cache_stats
        if prefix is not None:
            self.prefix_queries += prefix.queries
            self.prefix_hits += prefix.hits
            self.preempted_queries += getattr(prefix, "preempted_queries", 0)
            self.preempted_requests += getattr(prefix, "preempted_requests", 0)
            self.preempted_hits += getattr(prefix, "preempted_hits", 0)
        external = getattr(stats, "connector_prefix_cache_stats", None)
        if external is not None:
            self.connector_queries += external.queries
            self.connector_hits += external.hits
            self.connector_preempted_hits += getattr(external, "preempted_hits", 0)
        self._add_connector_stats(getattr(stats, "kv_connector_stats", None))
        return stats

    def _add_connector_stats(self, data: Any) -> None:
        """Sum vLLM's ``vllm:kv_offload_{store,load}_{bytes,time}`` counters, and the
        tiering manager's ``vllm:kv_offload_tiering_*`` ones into ``vllm_tiering``."""
        if not isinstance(data, dict):
            return
        values = data.get("data", {})
        for name, attr in (("vllm:kv_offload_store_bytes", "vllm_store_bytes"),
                           ("vllm:kv_offload_load_bytes", "vllm_load_bytes"),
                           ("vllm:kv_offload_store_time", "vllm_store_time"),
                           ("vllm:kv_offload_load_time", "vllm_load_time")):
            for value in values.get(name, {}).values():
                setattr(self, attr, getattr(self, attr) + value)
        for value in values.get("vllm:kv_offload_allocation_failure", {}).values():
            self.vllm_allocation_failures += value  # prepare_store calls vLLM saw refused
        types = data.get("types", {})
        for name, by_labels in values.items():
            if name.startswith("vllm:kv_offload_tiering_") and types.get(name) == "counter":
                self.vllm_tiering[name] = self.vllm_tiering.get(name, 0) + sum(
                    by_labels.values())

    def take_scheduler_stats(self) -> None:
        """Add the connector stats vLLM's scheduler side holds now (what its next
        ``update_from_output`` would report), so that the totals are complete."""
        stats = self.scheduler.connector.get_kv_connector_stats()
        if stats is not None and not stats.is_empty():
            self._add_connector_stats(stats.data)

    # -- the engine's truth ---------------------------------------------------------------
    def gpu_state(self) -> tuple[int, int]:
        """GPU ``(in_use, cached)`` blocks from the ``BlockPool`` (null block excluded)."""
        pool = self.block_pool
        free = pool.get_num_free_blocks()
        cached = sum(1 for b in pool.blocks if b.block_hash is not None and b.ref_cnt == 0
                     and not b.is_null)
        return pool.num_gpu_blocks - 1 - free, cached

    def host_state(self) -> tuple[int, int]:
        """Host ``(in_use, cached)`` chunks from what vLLM said and what the workers are
        doing, not from the manager's fields kvobs reads: chunks holding data are those
        vLLM's KV events stored on the CPU medium and did not remove; of those, chunks a
        load job in flight reads are in use, and so are chunks a store job in flight
        writes (not landed: no event yet)."""
        assert self.scheduler.kv_event_publisher is not None, "needs kv_events=True"
        landed = -self.host_queued_at_reset
        for event in self.kv_events[self.host_reset_at:]:
            kind = type(event).__name__
            if getattr(event, "medium", None) == "CPU":
                n = len(event.block_hashes)
                landed += n if kind == "BlockStored" else -n if kind == "BlockRemoved" else 0
        writing: set[int] = set()
        reading: set[int] = set()
        stale_below = self.connector_scheduler._stale_job_threshold  # a reset forgot these
        for job_id, (is_store, chunks) in self.in_flight.items():
            if job_id >= stale_below:
                (writing if is_store else reading).update(chunks)
        return len(writing) + len(reading), landed - len(reading)

    def prefill_tokens(self, out: Any) -> int:
        """Prompt tokens a ``SchedulerOutput`` computes, from vLLM's requests (after
        ``schedule()``, which has advanced their ``num_computed_tokens``)."""
        total = 0
        for req_id, n in out.num_scheduled_tokens.items():
            req = self.scheduler.requests[req_id]
            start = req.num_computed_tokens - n
            total += max(0, min(req.num_computed_tokens, req.num_prompt_tokens) - start)
        return total

    def truth(self) -> dict[str, tuple[int, int]]:
        """``{tier: (in_use, cached)}`` as vLLM holds it."""
        truth = {"gpu": self.gpu_state()}
        if self.offloading_manager is not None:
            truth["host"] = self.host_state()
        return truth

    def events_by_medium(self) -> dict[tuple[str, str], int]:
        """``{(event kind, medium): blocks}`` over every KV cache event so far."""
        counts: dict[tuple[str, str], int] = {}
        for event in self.kv_events:
            kind = type(event).__name__
            medium = str(getattr(event, "medium", None) or "GPU")
            key = (kind, medium)
            counts[key] = counts.get(key, 0) + len(getattr(event, "block_hashes", ()) or ())
        return counts
