"""A real LMCache 0.5.6 ``LMCacheEngine`` on CPU, driven per request as LMCache's vLLM
connector (``lmcache/integration/vllm/vllm_v1_adapter.py``) drives it.

Everything is LMCache's own except two things a vLLM process would provide:

* :class:`PagedCopyStandIn`, a stand-in for the GPU connector's byte copy (LMCache's
  vLLM connectors copy with CUDA kernels): it copies bytes between a CPU "paged KV"
  tensor (``[K/V, layer, slot, head, dim]``, vLLM's slots = block * block size + offset)
  and LMCache's memory objects, in LMCache's ``KV_2LTD`` layout; with ``use_layerwise``,
  :class:`LayerwiseCopyStandIn` copies one layer per step of LMCache's ``store_layer`` /
  ``retrieve_layer`` generators (``KV_T2D`` objects, one per layer of a chunk). Every
  bookkeeping step (chunking, keys, allocation, eviction, pins, stats) stays LMCache's.
* :class:`ConnectorDriver`, the connector's calls per request, in its order and with its
  arguments: the scheduler's ``get_num_new_matched_tokens`` (LMCache's own lookup client,
  which sends chunk hashes to ``engine.lookup(hashes, offsets, lookup_id, pin=True)`` as
  the worker's lookup server does), ``start_load_kv`` (masked ``retrieve``, then
  ``lookup_unpin``), ``wait_for_save`` (``lookup_unpin``, masked ``store``; with
  ``save_decode_cache`` also at each decode step whose tokens reach a new chunk
  boundary, as ``ReqMeta.from_request_tracker`` decides). vLLM's own
  prefix cache is a one-request GPU cache: a request reuses the full blocks it shares
  with the request before it, which is what makes the connector's masks non-trivial.

The truth is LMCache's: its Prometheus series (``lmcache:*``, fed by its
``LMCStatsMonitor``), its KV events, the data in the paged tensor after a retrieve, and
the number of chunks its backend holds when it first evicts.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from lmcache.v1 import cache_engine
from lmcache.v1.cache_engine import LMCacheEngine, LMCacheEngineBuilder
from lmcache.v1.config import LMCacheEngineConfig
from lmcache.v1.gpu_connector import GPUConnectorInterface
from lmcache.v1.lookup_client.lmcache_lookup_client_bypass import LMCacheBypassLookupClient
from lmcache.v1.metadata import LMCacheMetadata

CHUNK = 16                  # LMCache chunk_size and vLLM block_size
LAYERS, HEADS, DIM = 2, 2, 16
TOKEN_BYTES = 2 * LAYERS * HEADS * DIM * 2           # K and V, fp16
CHUNK_BYTES = CHUNK * TOKEN_BYTES                    # 4096: LMCache's 4 KiB alignment
HOST_CHUNKS = 24                                     # the CPU backend's buffer
GPU_BLOCKS = 64                                      # two regions of 32 blocks
INSTANCE = "vllm-instance"


class PagedCopyStandIn(GPUConnectorInterface):
    """Stand-in for the GPU connector's byte copy (not LMCache's code): copies between a
    CPU paged KV tensor (``kvcaches``) and memory objects, per chunk, by slot mapping.
    A test may set ``during_copy`` to run something while a ``store`` copies."""

    def __init__(self) -> None:
        self.kvcaches: Any = None
        self.during_copy: Callable[[], None] | None = None   # run inside batched_from_gpu

    def get_shape(self, num_tokens: int) -> torch.Size:
        return torch.Size([2, LAYERS, num_tokens, HEADS * DIM])

    def to_gpu(self, memory_obj: Any, start: int, end: int, **kwargs: Any) -> None:
        self.batched_to_gpu([memory_obj], [start], [end], **kwargs)

    def from_gpu(self, memory_obj: Any, start: int, end: int, **kwargs: Any) -> None:
        self.batched_from_gpu([memory_obj], [start], [end], **kwargs)

    def batched_from_gpu(self, memory_objs: Any, starts: Any, ends: Any, **kwargs: Any) -> None:
        if self.during_copy is not None:
            self.during_copy()
        paged, slots = kwargs["kvcaches"], kwargs["slot_mapping"]
        for obj, start, end in zip(memory_objs, starts, ends, strict=True):
            obj.tensor.copy_(paged[:, :, slots[start:end]].reshape(2, LAYERS, end - start,
                                                                   HEADS * DIM))

    def batched_to_gpu(self, memory_objs: Any = None, starts: Any = None, ends: Any = None,
                       **kwargs: Any) -> None:
        paged, slots = kwargs["kvcaches"], kwargs["slot_mapping"]
        for obj, start, end in zip(memory_objs, starts, ends, strict=True):
            paged[:, :, slots[start:end]] = obj.tensor.reshape(2, LAYERS, end - start, HEADS,
                                                               DIM)


class LayerwiseCopyStandIn(GPUConnectorInterface):
    """Stand-in for a layerwise GPU connector's byte copy (not LMCache's code): generators
    that copy one layer of every chunk per step, driven by LMCache's ``store_layer`` /
    ``retrieve_layer`` as they drive its vLLM layerwise connector (``num_layers + 1``
    steps out, ``num_layers + 2`` in). ``moved`` is its own account of what it copied
    per direction, ``[objects, bytes]``, counted as each object's bytes are copied."""

    def __init__(self) -> None:
        self.moved = {"out": [0, 0], "in": [0, 0]}

    def _moved(self, direction: str, obj: Any) -> None:
        self.moved[direction][0] += 1
        self.moved[direction][1] += obj.tensor.numel() * obj.tensor.element_size()

    def get_shape(self, num_tokens: int) -> torch.Size:
        return torch.Size([num_tokens, 2, HEADS * DIM])         # KV_T2D: one layer

    def to_gpu(self, memory_obj: Any, start: int, end: int, **kwargs: Any) -> None:
        raise NotImplementedError("layerwise: batched_to_gpu only")

    def from_gpu(self, memory_obj: Any, start: int, end: int, **kwargs: Any) -> None:
        raise NotImplementedError("layerwise: batched_from_gpu only")

    def batched_from_gpu(self, memory_objs: Any, starts: Any, ends: Any,
                         **kwargs: Any) -> Iterator[None]:
        paged, slots = kwargs["kvcaches"], kwargs["slot_mapping"]
        for layer, objs in enumerate(memory_objs):                # layer-major lists
            for obj, start, end in zip(objs, starts, ends, strict=True):
                obj.tensor.copy_(paged[:, layer, slots[start:end]].permute(1, 0, 2, 3)
                                 .reshape(end - start, 2, HEADS * DIM))
                self._moved("out", obj)
            yield
        yield

    def batched_to_gpu(self, starts: Any = None, ends: Any = None,
                       **kwargs: Any) -> Generator[None, Any, None]:
        paged, slots = kwargs["kvcaches"], kwargs["slot_mapping"]
        for layer in range(LAYERS):
            objs = yield                                          # this layer's chunks
            for obj, start, end in zip(objs, starts, ends, strict=True):
                paged[:, layer, slots[start:end]] = obj.tensor.reshape(
                    end - start, 2, HEADS, DIM).permute(1, 0, 2, 3)
                self._moved("in", obj)
        yield
        yield


_assert_layerwise = cache_engine.assert_layerwise_gpu_connector


def _layerwise_connector(connector: Any) -> None:
    """LMCache's check that a layerwise engine has a layerwise connector of its own
    classes (CUDA ones), letting the stand-in through."""
    if not isinstance(connector, LayerwiseCopyStandIn):
        _assert_layerwise(connector)


cache_engine.assert_layerwise_gpu_connector = _layerwise_connector   # type: ignore[attr-defined]


def build_engine(host_chunks: int = HOST_CHUNKS, instance: str = INSTANCE,
                 disk_dir: str | None = None, layerwise: bool = False,
                 save_unfull_chunk: bool = False, layers: int = LAYERS) -> LMCacheEngine:
    """An engine as the connector's worker builds it (``get_or_create``); the connector's
    ``register_kv_caches`` runs its ``post_init`` later. With ``disk_dir``, LMCache's
    ``LocalDiskBackend`` (64 chunks there) sits behind the CPU backend; ``layerwise``: its
    ``use_layerwise`` (one memory object per layer of a chunk); ``save_unfull_chunk``:
    a prompt's partial last chunk is stored too (LMCache's setting; the connector's
    ``discard_partial_chunks`` would not hand it over); ``layers``: the model's layers
    (another count than ``LAYERS`` only for an engine no request is served by)."""
    disk = {} if disk_dir is None else {
        "local_disk": f"file://{disk_dir}/", "max_local_disk_size": 64 * CHUNK_BYTES / 1024**3}
    config = LMCacheEngineConfig.from_defaults(
        chunk_size=CHUNK, local_cpu=True, max_local_cpu_size=host_chunks * CHUNK_BYTES / 1024**3,
        save_unfull_chunk=save_unfull_chunk, enable_kv_events=True, use_layerwise=layerwise, **disk)
    metadata = LMCacheMetadata(model_name="tiny-llama", world_size=1, local_world_size=1,
                               worker_id=0, local_worker_id=0, kv_dtype=torch.float16,
                               kv_shape=(layers, 2, CHUNK, HEADS, DIM), role="worker",
                               chunk_size=CHUNK)
    connector = LayerwiseCopyStandIn() if layerwise else PagedCopyStandIn()
    engine = LMCacheEngineBuilder.get_or_create(instance, config, metadata, connector,
                                                lambda tensor, src: tensor,
                                                lambda obj, src: obj)
    # LMCache's stats thread folds the monitor into its Prometheus series every 10 s;
    # the tests fold it once at the end (LMCacheTruth.read), so no interval is lost
    LMCacheEngineBuilder._stat_loggers[instance].shutdown()
    return engine


def destroy(instance: str = INSTANCE) -> None:
    LMCacheEngineBuilder.destroy(instance)


def destroy_all() -> None:
    """Destroy every engine still built: LMCache's storage threads (not daemons) would
    keep the test process alive after a failure."""
    for instance in list(LMCacheEngineBuilder._instances):
        LMCacheEngineBuilder.destroy(instance)


# --- LMCache's own account -------------------------------------------------------------

COUNTERS = {  # name in these tests -> LMCache's Prometheus series
    "lookup_requests": "lmcache:num_lookup_requests_total",
    "lookup_tokens": "lmcache:num_lookup_tokens_total",
    "lookup_hits": "lmcache:num_lookup_hits_total",
    "retrieve_requests": "lmcache:num_retrieve_requests_total",
    "requested_tokens": "lmcache:num_requested_tokens_total",
    "hit_tokens": "lmcache:num_hit_tokens_total",
    "store_requests": "lmcache:num_store_requests_total",
    "stored_tokens": "lmcache:num_stored_tokens_total",
    "evict_keys": "lmcache:local_cpu_evict_keys_count_total",
    "store_from_gpu_s": "lmcache:store_from_gpu_time_sum",
    "retrieve_to_gpu_s": "lmcache:retrieve_to_gpu_time_sum",
    "store_from_gpu_n": "lmcache:store_from_gpu_time_count",
    "retrieve_to_gpu_n": "lmcache:retrieve_to_gpu_time_count",
}
GAUGES = {
    "local_cache_usage": "lmcache:local_cache_usage",
    "active_memory_objs": "lmcache:active_memory_objs_count",
    "hot_cache_count": "lmcache:local_cpu_hot_cache_count",
}


def lmcache_metrics(engine: LMCacheEngine, instance: str = INSTANCE) -> dict[str, float]:
    """LMCache's ``lmcache:*`` series of this engine, as its ``/metrics`` would show them
    after its stats thread's next fold (done here: ``get_stats_and_clear`` ->
    ``log_prometheus``)."""
    stat_logger = LMCacheEngineBuilder._stat_loggers[instance]
    prom = stat_logger.prometheus_logger
    prom.log_prometheus(engine.stats_monitor.get_stats_and_clear())
    labels = {k: str(v) for k, v in prom.labels.items()}
    wanted = {**{v: k for k, v in COUNTERS.items()}, **{v: k for k, v in GAUGES.items()}}
    values = dict.fromkeys([*COUNTERS, *GAUGES], 0.0)
    from prometheus_client import REGISTRY
    for family in REGISTRY.collect():
        for sample in family.samples:
            if sample.name in wanted and all(sample.labels.get(k) == v
                                             for k, v in labels.items()):
                values[wanted[sample.name]] += sample.value
    return values


# --- the connector's calls per request ---------------------------------------------------

def kv_value(token: int, position: int) -> float:
    """What the model writes for a token at a position (the same prefix gives the same KV,
    so a retrieved chunk can be checked against a recompute)."""
    return float((token * 31 + position * 7) % 997) / 16.0


@dataclass
class RequestOutcome:
    req_id: str
    prompt_tokens: int
    vllm_cached: int           # vLLM's own GPU prefix hit
    lmcache_hit: int           # what LMCache's lookup returned
    retrieved: int             # tokens ``retrieve`` marked
    stored_from: int           # first token ``store`` wrote (its mask's False prefix)
    stored_to: int             # tokens handed to ``store``


@dataclass
class ConnectorDriver:
    """LMCache's vLLM connector, scheduler and worker in one process, one step per
    request (a full prefill), for a real engine and a CPU paged KV tensor."""

    engine: LMCacheEngine
    paged: torch.Tensor = field(default_factory=lambda: torch.zeros(
        2, LAYERS, GPU_BLOCKS * CHUNK, HEADS, DIM, dtype=torch.float16))
    served: int = 0
    save_decode: bool = False  # LMCache's save_decode_cache: chunks of the answer stored
    decode_stores: int = 0     # store calls made in decode (answer chunks)
    _gpu_cached: tuple[list[int], list[int]] = field(default_factory=lambda: ([], []))
    onloads_checked: int = 0

    def __post_init__(self) -> None:
        self.lookup_client = LMCacheBypassLookupClient(self.engine.config, self.engine.metadata,
                                                       self.engine)

    def serve(self, prompt: list[int], answer: list[int] | None = None) -> RequestOutcome:
        """One request: its prefill, then (``answer``: the tokens it generates) its
        decode, whose KV is every answer token's but the last (never fed back)."""
        answer = answer or []
        req_id = f"req-{self.served}"
        region = self.served % 2 * (GPU_BLOCKS // 2)
        self.served += 1
        # vLLM's prefix cache: full blocks shared with the request before (never the
        # whole prompt: vLLM recomputes the last token)
        prev_tokens, prev_blocks = self._gpu_cached
        shared = 0
        while (shared + 1) * CHUNK <= min(len(prev_tokens), len(prompt) - 1) and \
                prompt[shared * CHUNK:(shared + 1) * CHUNK] == \
                prev_tokens[shared * CHUNK:(shared + 1) * CHUNK]:
            shared += 1
        vllm_cached = shared * CHUNK
        tokens = prompt + answer[:-1]                    # the tokens that get KV
        blocks = prev_blocks[:shared] + [region + i for i in range(
            -(-len(tokens) // CHUNK) - shared)]
        assert len(blocks) <= GPU_BLOCKS // 2, "a request outgrew its GPU region"
        slots = (torch.tensor(blocks).reshape(-1, 1) * CHUNK + torch.arange(CHUNK)).flatten()
        slot_mapping = slots[:len(tokens)].to(torch.long)

        # scheduler: get_num_new_matched_tokens / update_state_after_alloc
        hit = self.lookup_client.lookup(prompt, lookup_id=req_id, request_configs=None)
        need = hit - vllm_cached - (1 if hit == len(prompt) else 0)
        can_load = need > 0

        # worker: start_load_kv (synchronous; layerwise: every layer in this step)
        retrieved = 0
        if can_load:
            token_mask = torch.ones(len(prompt), dtype=torch.bool)
            token_mask[:vllm_cached // CHUNK * CHUNK] = False
            ret = self._retrieve(prompt[:hit], token_mask[:hit], kvcaches=self.paged,
                                       slot_mapping=slot_mapping[:hit],
                                       vllm_cached_tokens=vllm_cached, request_configs=None,
                                       req_id=req_id)
            self.engine.lookup_unpin(req_id)
            retrieved = int(ret.sum().item())
            self._check_loaded(prompt, slot_mapping, vllm_cached // CHUNK * CHUNK, hit)
        # the forward pass computes the rest
        computed_from = max(vllm_cached, hit if can_load else 0)
        self._compute(prompt, slot_mapping, computed_from)

        # worker: wait_for_save (ReqMeta.from_request_tracker, discard_partial_chunks)
        self.engine.lookup_unpin(req_id)
        skip_leading = hit
        stored_from = stored_to = 0
        boundary = -(-(skip_leading + 1) // CHUNK) * CHUNK
        skip_save = skip_leading > 0 and len(prompt) < boundary
        to_save = len(prompt) // CHUNK * CHUNK
        if not skip_save and skip_leading != to_save:
            skip_leading = skip_leading // CHUNK * CHUNK
            store_mask = torch.ones(to_save, dtype=torch.bool)
            store_mask[:skip_leading] = False
            self._store(prompt[:to_save], mask=store_mask, kvcaches=self.paged,
                              slot_mapping=slot_mapping[:to_save], offset=skip_leading,
                              transfer_spec=None, request_configs=None, req_id=req_id)
            stored_from, stored_to = skip_leading, to_save
        saved = hit if skip_save else to_save            # tracker.num_saved_tokens
        if answer:
            self._decode(tokens, len(prompt), saved, slot_mapping, req_id)
        self._gpu_cached = (tokens, blocks)
        return RequestOutcome(req_id, len(prompt), vllm_cached, hit, retrieved, stored_from,
                              stored_to)

    def _retrieve(self, tokens: list[int], mask: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        """``retrieve``; for a layerwise engine ``retrieve_layer`` run through all its
        layers (the connector steps it once per layer of the forward pass)."""
        if not self.engine.use_layerwise:
            return self.engine.retrieve(tokens, mask, **kwargs)
        kwargs.pop("request_configs", None)
        *_, ret = self.engine.retrieve_layer(tokens, mask, sync=False, **kwargs)
        return ret                                       # its last step: the token mask

    def _store(self, tokens: list[int], **kwargs: Any) -> None:
        """``store``; for a layerwise engine ``store_layer`` run through all its layers."""
        if not self.engine.use_layerwise:
            self.engine.store(tokens, **kwargs)
            return
        for key in ("transfer_spec", "request_configs"):
            kwargs.pop(key, None)
        for _ in self.engine.store_layer(tokens, sync=False, **kwargs):
            pass

    def _decode(self, tokens: list[int], start: int, saved: int, slots: torch.Tensor,
                req_id: str) -> None:
        """Decode steps: each writes one token's KV; with ``save_decode`` a step whose
        tokens reach the chunk boundary past the saved ones stores the new full chunks
        (masked: the saved prefix is not stored again)."""
        for pos in range(start, len(tokens)):
            self._compute(tokens, slots, pos, pos + 1)
            done = pos + 1
            if not self.save_decode or done < -(-(saved + 1) // CHUNK) * CHUNK:
                continue
            to_save = done // CHUNK * CHUNK
            mask = torch.ones(to_save, dtype=torch.bool)
            mask[:saved] = False
            self._store(tokens[:to_save], mask=mask, kvcaches=self.paged,
                              slot_mapping=slots[:to_save], offset=saved, transfer_spec=None,
                              request_configs=None, req_id=req_id)
            self.decode_stores += 1
            saved = to_save

    def _compute(self, prompt: list[int], slots: torch.Tensor, start: int,
                 end: int | None = None) -> None:
        for pos in range(start, len(prompt) if end is None else end):
            self.paged[:, :, slots[pos]] = kv_value(prompt[pos], pos)

    def _check_loaded(self, prompt: list[int], slots: torch.Tensor, start: int, end: int) -> None:
        """The data truth: what ``retrieve`` put in the paged tensor is what a recompute
        of those tokens writes."""
        for pos in range(start, end):
            got = self.paged[:, :, slots[pos]]
            assert torch.all(got == kv_value(prompt[pos], pos)), f"token {pos} loaded wrong KV"
        self.onloads_checked += end - start


def chats(seed: int = 7) -> Iterator[list[int]]:
    """Four multi-turn chats sharing a 48-token system prompt, interleaved, plus fully new
    one-off requests: 16 requests, prefix hits, and more chunks than the CPU backend holds."""
    rng = random.Random(seed)
    system = [rng.randrange(1, 500) for _ in range(3 * CHUNK)]
    histories = {name: list(system) for name in "ABCD"}
    order = ["A", "B", "new", "A", "C", "B", "new", "D", "A", "C", "new", "B", "D", "C",
             "new", "A"]
    for who in order:
        if who == "new":
            yield [rng.randrange(500, 1000) for _ in range(rng.randrange(40, 90))]
            continue
        history = histories[who]
        history += [rng.randrange(1, 500) for _ in range(rng.randrange(18, 40))]  # user turn
        yield list(history)
        history += [rng.randrange(1, 500) for _ in range(rng.randrange(8, 20))]   # answer
