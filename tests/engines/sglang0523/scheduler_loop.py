"""SGLang 0.5.23's own scheduler stack on CPU, driven round by round as ``Scheduler`` does.

Built as ``create_unified_radix_cache`` builds it with ``--enable-hierarchical-cache``:
``ServerArgs`` published for the scheduler, a ``PagedTokenToKVPoolAllocator`` over an
``MHATokenToKVPool``, ``UnifiedRadixCache(CacheInitParams(...))``, then
``init_hicache`` (``HybridCacheController`` over a ``HostPoolGroup`` whose anchor is an
``MHATokenToKVPoolHost``). One :meth:`Engine.step` is one scheduler iteration:

1. ``tree_cache.check_hicache_events()`` (reaps finished backups and load-backs); a
   chunked request's computed chunk is stashed (``checkpoint_kv_cache``);
2. ``get_new_batch_prefill``: a real ``PrefillAdder`` (``chunk``: the chunked-prefill
   size; the chunked request continues through ``add_chunked_req``, not re-matched);
   every waiting request in order
   gets ``Req.init_next_round_input(tree_cache)`` (``match_prefix``) and
   ``adder.add_one_req`` (``init_load_back`` for host hits) until one is refused; the
   admitted ones become a real ``ScheduleBatch`` (``init_new``),
   ``ready_to_load_host_cache()``, ``prepare_for_extend()``
   (``alloc_paged_token_slots_extend``, evicting through ``evict_for_alloc``);
3. otherwise the running batch decodes: ``filter_batch``, ``prepare_for_decode()``
   (``alloc_paged_token_slots_decode``);
4. the results: every request whose prompt is done gets one output token; finished ones
   ``release_kv_cache(req, tree_cache, checkpoint=True)``, unfinished prefills
   ``checkpoint_kv_cache``; the prefill batch merges into the running batch.

The model forward is the only thing not run: each step writes every new token's KV as
its token id (layer 0 keys), so :meth:`Engine.prefix_is_intact` checks the bytes a
load-back brought to the device.

CPU stand-ins (CUDA-only calls; they move bytes or pin pages, no bookkeeping):

* :func:`stand_in_host_register` for ``pool_host.common._cuda_host_register``
  (``cudaHostRegister`` page-locks the host pool; on CPU there is nothing to lock);
* :func:`stand_in_transfer_kv_direct` for ``sgl_kernel``'s ``transfer_kv_direct``
  (the device<->host copy of the ``direct`` I/O backend): the same rows copied with
  torch indexing, layer by layer.

One test adds a third, :class:`StandInTimingEvent`, for the CUDA timing events
(``torch.cuda.Event(enable_timing=True)``, which ``l2_transfer.make_timing_event_pair``
makes; ``torch.cpu.Event`` cannot time): each pair reports a fixed device time, so the
path SGLang takes on a GPU (``HiCacheAck.timing_enabled``) runs on CPU.

SGLang's truth: its ``RadixCacheMetricsCollector`` (counters ``sglang:evicted_tokens_total``,
``sglang:hicache_backup_{tokens,bytes}_total``, ``sglang:load_back_{tokens,bytes}_total``,
``sglang:hicache_dropped_tokens_total``, the duration histograms) in a registry of its
own per engine, the ``PrefillAdder``'s ``log_{device,host}_hit_tokens`` (what the
scheduler reports as ``cached_tokens`` by source) and each ``Req``'s
``cached_tokens_device`` / ``cached_tokens_host`` from ``prepare_for_extend``.
"""

from __future__ import annotations

import functools
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import torch
from prometheus_client import CollectorRegistry, Counter, Histogram
from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
from sglang.srt.managers.schedule_policy import AddReqResult, PrefillAdder
from sglang.srt.managers.scheduler_components.metrics_reporter import SchedulerMetricsReporter
from sglang.srt.managers.scheduler_components.pool_stats_observer import (
    SchedulerPoolStatsObserver,
)
from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.common import checkpoint_kv_cache, release_kv_cache
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
from sglang.srt.mem_cache.pool_host import common as host_common
from sglang.srt.mem_cache.pool_host import mha as host_mha
from sglang.srt.mem_cache.unified_cache.components.base import ComponentType
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
from sglang.srt.observability.metrics_collector import RadixCacheMetricsCollector
from sglang.srt.runtime_context import get_parallel
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

HEADS, DIM, LAYERS = 2, 64, 2
VOCAB = 2048                      # token ids stay exact in float16 KV
LABELS = {"cache_type": "UnifiedRadixCache"}


def stand_in_host_register(buffer: torch.Tensor,
                           registration_granularity_bytes: int | None = None) -> None:
    """Stand-in for ``_cuda_host_register``: page-locking has no CPU meaning."""


def stand_in_transfer_kv_direct(src_layers: Sequence[torch.Tensor],
                                dst_layers: Sequence[torch.Tensor], src_indices: torch.Tensor,
                                dst_indices: torch.Tensor, page_size: int) -> None:
    """Stand-in for ``sgl_kernel.kvcacheio.transfer_kv_direct``: copy token rows
    ``src -> dst`` per layer (the bytes only; SGLang keeps all bookkeeping)."""
    for src, dst in zip(src_layers, dst_layers, strict=True):
        dst[dst_indices.to(dst.device)] = src[src_indices.to(src.device)]


class StandInTimingEvent:
    """Stand-in for a CUDA timing event: complete at once; a pair spans ``ms``."""

    def __init__(self, ms: float) -> None:
        self.ms = ms

    def record(self, stream: Any = None) -> None:
        """Nothing is queued on a CPU stream."""

    def wait(self, stream: Any = None) -> None:
        """Nothing to wait for."""

    def synchronize(self) -> None:
        """Complete already."""

    def query(self) -> bool:
        return True

    def elapsed_time(self, end: StandInTimingEvent) -> float:
        return end.ms


def install_timing_stand_in(monkeypatch: Any, ms: float) -> None:
    """Every HiCache copy gets a stand-in timing event pair reporting ``ms``."""
    from sglang.srt.mem_cache import l2_transfer

    monkeypatch.setattr(l2_transfer, "make_timing_event_pair",
                        lambda: (StandInTimingEvent(0.0), StandInTimingEvent(ms), True))


def install_stand_ins(monkeypatch: Any) -> None:
    """Replace the two CUDA-only calls (pytest's ``monkeypatch`` undoes it)."""
    monkeypatch.setattr(host_common, "_cuda_host_register", stand_in_host_register)
    monkeypatch.setattr(host_mha, "transfer_kv_direct", stand_in_transfer_kv_direct,
                        raising=False)


def _sampled_at(prompt_tokens: int, outputs: int) -> int:
    """The token the stand-in model samples after ``outputs`` output tokens of a prompt of
    ``prompt_tokens`` (a function of the lengths alone, so a batch launched before the
    last one's results knows it, and a request can be given a stop token in advance)."""
    return 1 + (prompt_tokens + outputs) % 97


def _sampled(req: Req) -> int:
    """The token the stand-in model samples for ``req`` next."""
    return _sampled_at(len(req.origin_input_ids), len(req.output_ids))


class _ModelConfig:
    """What ``ScheduleBatch`` reads of the model config (a text-only decoder)."""

    vocab_size = VOCAB
    is_encoder_decoder = False
    is_multimodal = False
    hf_eos_token_id = None


@dataclass
class Engine:
    """One scheduler's KV stack and its loop; see the module docstring."""

    write_policy: str = "write_through"
    tokens: int = 512             # device KV slots
    page: int = 16
    host_ratio: float = 2.0
    max_reqs: int = 16
    context: int = 512
    chunk: int | None = None      # --chunked-prefill-size (None: prompts whole)
    kv_events: bool = False       # --kv-events-config: the tree records BlockStored / Removed
    #: SGLang's overlap scheduler (``event_loop_overlap``, its default on a GPU; off:
    #: ``--disable-overlap-schedule``, ``event_loop_normal``): see :meth:`step`
    overlap: bool = False
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        args = ServerArgs(model_path="dummy", page_size=self.page, device="cpu",
                          enable_hierarchical_cache=True, hicache_io_backend="direct",
                          hicache_mem_layout="layer_first", hicache_ratio=self.host_ratio,
                          hicache_write_policy=self.write_policy,
                          attention_backend="torch_native")
        set_global_server_args_for_scheduler(args)
        get_parallel().override_permanently(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1)
        self.kv = MHATokenToKVPool(self.tokens, self.page, torch.float16, HEADS, DIM, LAYERS,
                                   "cpu", False, enable_alt_stream=False)
        self.allocator = PagedTokenToKVPoolAllocator(self.tokens, self.page, torch.float16,
                                                     "cpu", self.kv, False)
        self.req_to_token = ReqToTokenPool(size=self.max_reqs, max_context_len=self.context,
                                           device="cpu", enable_memory_saver=False)
        params = CacheInitParams(disable=False, req_to_token_pool=self.req_to_token,
                                 token_to_kv_pool_allocator=self.allocator,
                                 page_size=self.page, tree_components=(ComponentType.FULL,),
                                 enable_kv_cache_events=self.kv_events)
        self.tree = UnifiedRadixCache(params)
        # SGLang's own collector, its counters in this engine's registry (the process
        # registry would refuse a second engine's series).
        registry = self.registry

        class Collector(RadixCacheMetricsCollector):
            _counter_cls = functools.partial(Counter, registry=registry)
            _histogram_cls = functools.partial(Histogram, registry=registry)

        self.tree.metrics_collector = Collector(labels=dict(LABELS))
        self.tree.init_hicache(args, params)
        self.controller = self.tree.cache_controller
        self.group = self.controller.mem_pool_host
        self.host_pool = self.group.anchor_entry.host_pool
        self.waiting: list[Req] = []
        self.running: ScheduleBatch | None = None
        self.chunked: Req | None = None  # Scheduler.chunked_req
        self.admitted: list[Req] = []
        self.finished: list[Req] = []
        self.device_hit_tokens = 0     # PrefillAdder.log_device_hit_tokens, summed
        self.host_hit_tokens = 0       # PrefillAdder.log_host_hit_tokens, summed
        self.prompt_tokens = 0         # log_hit_tokens + log_input_tokens, summed
        self.match_calls = 0           # Req.init_next_round_input calls
        self.intact_tokens = 0         # prefix tokens whose KV bytes were checked
        self.prefill_batches = 0
        self._next = 0
        #: overlap: the batch launched last step, its results not processed yet: the
        #: batch, its copy in ``result_queue`` and whether it was a prefill
        self._launched: tuple[ScheduleBatch, ScheduleBatch, bool] | None = None

    # -- requests -----------------------------------------------------------------
    def submit(self, prompt: Sequence[int], max_new_tokens: int = 4,
               stops: bool = False) -> Req:
        """A request in the waiting queue (what ``Scheduler.handle_generate_request``
        builds), ending at ``max_new_tokens`` output tokens: by length, which the overlap
        loop sees coming, or (``stops``) by sampling a stop token there, which SGLang
        learns only from the batch's result (the overlap loop has then launched the
        request in the next batch already)."""
        if stops:  # the stand-in's max_new_tokens-th token is a stop token (<= 97: unique)
            assert max_new_tokens <= 97
            stop = _sampled_at(len(prompt), max_new_tokens - 1)
            params = SamplingParams(max_new_tokens=max_new_tokens + 16, stop_token_ids=[stop])
        else:
            params = SamplingParams(max_new_tokens=max_new_tokens, ignore_eos=True)
        params.normalize(None)
        req = Req(f"req-{self._next}", "", array("q", prompt), params, vocab_size=VOCAB)
        self._next += 1
        self.waiting.append(req)
        return req

    # -- one scheduler iteration ----------------------------------------------------
    def step(self) -> str:
        """One iteration; returns ``"prefill"``, ``"decode"`` or ``"idle"`` (what it
        launched).

        Without overlap a batch's results are processed in the iteration that ran it.
        With overlap, as ``event_loop_overlap``: the last iteration's batch is merged into
        the running batch before its results are known (``get_next_batch_to_run``), the
        next batch is launched (a decode batch leaves out the requests the last batch's
        result finishes by length, ``_reqs_finishing_inflight``), and only then are the
        last batch's results processed (a request that finished otherwise, which ran one
        batch more, is skipped in that batch's results, and ``release_kv_cache`` frees the
        slot it took). A decode batch's KV rows are written at its launch, as its forward
        writes them before any later batch's: the token they hold is the one the batch
        before it samples (SGLang's future map), known here before that batch's results.
        """
        if self.overlap:
            return self._step_overlap()
        self._begin()
        batch = self._launch_prefill()
        if batch is not None:
            self._process(batch, prefill=True)
            self._merge(batch)
            return "prefill"
        running = self.running
        if running is None or running.is_empty():
            return "idle"
        running.prepare_for_decode()
        self._write_kv(running, [r.output_ids[-1:] for r in running.reqs])
        self._process(running, prefill=False)
        running.filter_batch()
        return "decode"

    def _step_overlap(self) -> str:
        self._begin()
        launched = self._launched
        if launched is not None and launched[2]:             # the last prefill batch
            self._merge(launched[0])
        kind, batch = "idle", self._launch_prefill()
        if batch is not None:
            kind = "prefill"
        elif self.running is not None:                     # update_running_batch:
            # requests the last batch's result finishes by length stay out of this one
            # (_reqs_finishing_inflight); their release comes with that result
            queued = set(launched[1].reqs) if launched is not None else set()
            self.running.filter_batch(reqs_to_exclude=[
                r for r in self.running.reqs
                if r in queued and r.next_output_finishes_by_length()])
            if not self.running.is_empty():
                self.running.prepare_for_decode()
                batch, kind = self.running, "decode"
                # its input: the token the last batch samples (SGLang's future map)
                self._write_kv(batch, [[_sampled(r)] for r in batch.reqs])
        # the result queue holds a copy; a prefill batch itself is merged next iteration
        self._launched = None if batch is None else (batch, batch.copy(), kind == "prefill")
        if launched is not None:                             # the last batch's results
            _, last, prefill = launched
            self._process(last, prefill=prefill)
        return kind

    def _begin(self) -> None:
        """An iteration's start: finished transfers reaped, a chunked request's computed
        chunk stashed (``stash_chunked_request``)."""
        self.tree.check_hicache_events()
        if self.chunked is not None and self.chunked.extend_end > self.chunked.prefix_len:
            checkpoint_kv_cache(self.chunked, self.tree)

    def _launch_prefill(self) -> ScheduleBatch | None:
        """The prefill batch, if any, its KV rows written (the forward)."""
        batch = self._prefill_batch()
        if batch is not None:
            extends = zip(batch.reqs, batch.prefix_lens, strict=True)
            self._write_kv(batch, [r.get_fill_ids()[n:] for r, n in extends])
        return batch

    def _merge(self, batch: ScheduleBatch) -> None:
        """A prefill batch joins the running batch (its chunked request stays out)."""
        batch.filter_batch(reqs_to_exclude=self.chunked)
        if not batch.is_empty():
            if self.running is None or self.running.is_empty():
                self.running = batch
            else:
                self.running.merge_batch(batch)

    def run(self, max_steps: int = 1000) -> int:
        """Step until no request waits or runs; returns the steps taken."""
        for n in range(max_steps):
            if self.step() == "idle" and not self.waiting and self.chunked is None:
                self.tree.check_hicache_events()
                return n
        raise AssertionError("the loop did not drain")

    def flush_cache(self) -> None:
        """``Scheduler.flush_cache`` of an idle scheduler (``/flush_cache``)."""
        assert not self.waiting and (self.running is None or self.running.is_empty())
        self.tree.reset()
        self.req_to_token.clear()
        self.allocator.clear()
        self.req_to_token.reset_aux_cache_allocator()

    def _prefill_batch(self) -> ScheduleBatch | None:
        running = self.running if self.running is not None and not self.running.is_empty() \
            else None
        adder = PrefillAdder(self.page, self.tree, self.allocator, running, 0.5,
                             self.tokens * 4, self.chunk)
        if self.chunked is not None:                     # its next chunk, no new match
            self.chunked.init_next_round_input()
            self.chunked = adder.add_chunked_req(self.chunked)
        for req in self.waiting:
            req.init_next_round_input(self.tree)
            self.match_calls += 1
            if adder.add_one_req(req, has_chunked_req=self.chunked is not None,
                                 truncation_align_size=None) != AddReqResult.CONTINUE:
                break
        scheduled = list(adder.can_run_list)
        if not scheduled:
            return None
        if adder.new_chunked_req is not None:
            assert self.chunked is None
            self.chunked = adder.new_chunked_req
        if self.chunked is not None:
            self.chunked.inflight_middle_chunks += 1
        admitted = [r for r in scheduled if r in self.waiting]
        self.device_hit_tokens += adder.log_device_hit_tokens
        self.host_hit_tokens += adder.log_host_hit_tokens
        self.prompt_tokens += adder.log_hit_tokens + adder.log_input_tokens
        self.waiting = [r for r in self.waiting if r not in admitted]
        self.admitted += admitted
        batch = ScheduleBatch.init_new(scheduled, self.req_to_token, self.allocator, self.tree,
                                       _ModelConfig(), False, SpeculativeAlgorithm.NONE,
                                       chunked_req=self.chunked)
        self.prefill_batches += 1
        batch.hicache_consumer_index = self.tree.ready_to_load_host_cache()
        batch.prepare_for_extend()
        for req in admitted:
            self.intact_tokens += self.prefix_is_intact(req)
        return batch

    def _write_kv(self, batch: ScheduleBatch, new_tokens: list[Any]) -> None:
        """The forward's only effect kvobs can see: KV rows written at ``out_cache_loc``
        (layer 0 keys hold the token id)."""
        tokens = [t for part in new_tokens for t in part]
        loc = batch.out_cache_loc
        assert len(loc) == len(tokens), (len(loc), len(tokens))
        self.kv.k_buffer[0][loc] = torch.tensor(tokens, dtype=torch.float16)[:, None, None]

    def _process(self, batch: ScheduleBatch, prefill: bool) -> None:
        """``process_batch_result``: one token per request, finished ones released; a
        request with chunks still to run gets none."""
        for req in batch.reqs:
            if prefill and req.inflight_middle_chunks > 0:
                req.inflight_middle_chunks -= 1
                continue
            if req.finished():  # overlap: it finished in the batch before, ran one more
                continue
            req.output_ids.append(_sampled(req))
            req.update_finish_state()
            if req.finished():
                release_kv_cache(req, self.tree, checkpoint=True)
                self.finished.append(req)
            elif prefill:
                checkpoint_kv_cache(req, self.tree)

    # -- SGLang's own account -------------------------------------------------------
    def prefix_is_intact(self, req: Req) -> int:
        """The device KV of ``req``'s cached prefix holds its tokens (after a load-back
        too); returns the prefix tokens checked."""
        n = req.prefix_len
        if n == 0:
            return 0
        rows = self.req_to_token.req_to_token[req.kv.req_pool_idx, :n].to(torch.int64)
        got = self.kv.k_buffer[0][rows][:, 0, 0].to(torch.int64).tolist()
        assert got == list(req.get_fill_ids()[:n]), f"{req.rid}: prefix KV differs"
        return n

    def metric(self, name: str, **labels: str) -> float:
        """A sample of SGLang's own radix-cache collector (0 if never incremented)."""
        value = self.registry.get_sample_value(name, {**LABELS, **labels})
        return 0.0 if value is None else value

    def pool_stats(self) -> tuple[Any, Any]:
        """What SGLang's scheduler reports of its pools, by its own code: the
        ``SchedulerPoolStatsObserver``'s token info (``full_num_used`` = max total tokens
        - available - evictable, ``full_evictable_size``, ``full_capacity``: its
        ``sglang:num_used_tokens`` / token usage / logs) and the metrics reporter's HiCache
        host stats (``sglang:hicache_host_{used,total}_tokens``)."""
        device = SchedulerPoolStatsObserver._get_token_info(SimpleNamespace(
            token_to_kv_pool_allocator=self.allocator, tree_cache=self.tree,
            max_total_num_tokens=self.tokens))
        host = SimpleNamespace()
        SchedulerMetricsReporter._log_hicache_stats(SimpleNamespace(
            scheduler=SimpleNamespace(enable_hierarchical_cache=True, tree_cache=self.tree),
            stats=host))
        return device, host

    def truth(self) -> dict[str, tuple[int, int]]:
        """SGLang's pools as ``(in_use, cached)`` pages, as its scheduler reports them
        (:meth:`pool_stats`): in use = its used tokens, cached = the tree's evictable
        tokens; on the host every reserved page holds backed-up KV."""
        device, host = self.pool_stats()
        return {"gpu": (self._pages(device.full_num_used),
                        self._pages(device.full_evictable_size)),
                "host": (0, self._pages(host.hicache_host_used_tokens))}

    def _pages(self, tokens: int) -> int:
        assert tokens % self.page == 0, f"{tokens} tokens: not whole pages"
        return tokens // self.page
