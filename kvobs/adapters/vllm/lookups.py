"""vLLM 0.33 ``KVCacheManager`` prefix lookups -> lookup tokens, GPU hits and host hits.

vLLM's scheduler calls ``record_prefix_cache_stats(request, num_hits)`` once per request
it admits (after allocating its blocks), which is exactly the lookup its own prefix-cache
hit rate counts; lookups of requests that were not admitted are not counted, and
re-admissions of preempted requests go to vLLM's ``preempted_*`` figures, not to
``queries`` / ``hits``. kvobs counts the same calls the same way, whether or not
vLLM's ``log_stats`` is on.

Host hits are the chunks the offloading manager pinned for loading for that request in
the same scheduling step (``prepare_load`` runs inside ``update_state_after_alloc``, just
before the stats call); :class:`HostHits` carries them from one adapter to the other.

Example:
    >>> hits = HostHits(tokens_per_chunk=64)
    >>> hits.add("req-1", chunks=2); hits.take("req-1"), hits.take("req-1")
    (128, 0)
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from kvobs.adapters._hooks import AdapterSpec, Hook, Instrumentation, instrument
from kvobs.recorder import Recorder

COMPONENT = "vllm.kv_cache_manager"


class HostHits:
    """Host-hit tokens per request, waiting for the request's lookup to be recorded.

    Bounded: a request that never reaches the stats call (aborted between steps) is
    forgotten after ``max_requests`` newer ones.
    """

    def __init__(self, tokens_per_chunk: int, max_requests: int = 4096) -> None:
        self.tokens_per_chunk = tokens_per_chunk
        self.max_requests = max_requests
        self._pending: OrderedDict[str, int] = OrderedDict()
        self._lock = threading.Lock()

    def add(self, request_id: str, chunks: int) -> None:
        """``chunks`` host chunks of ``request_id`` will be loaded to the GPU."""
        with self._lock:
            self._pending[request_id] = self._pending.get(request_id, 0) + chunks
            while len(self._pending) > self.max_requests:
                self._pending.popitem(last=False)

    def take(self, request_id: str) -> int:
        """Host-hit tokens recorded for ``request_id`` (0 if none), forgetting them."""
        with self._lock:
            return self._pending.pop(request_id, 0) * self.tokens_per_chunk


class LookupInstrumentation(Instrumentation):
    """Wrapper on ``KVCacheManager.record_prefix_cache_stats``.

    ``preempted_lookups`` counts re-lookups of preempted requests, which vLLM's hit rate
    (and so kvobs's lookup series) leaves out.
    """

    host_hits: HostHits | None = None
    preempted_lookups: int = 0


def _recorded(inst: LookupInstrumentation, state: None, result: None, request: Any,
              num_hits: int) -> None:
    if not inst.target.prefix_cache_lookup_enabled(request):
        return
    pending = inst.host_hits
    host = pending.take(request.request_id) if pending is not None else 0
    if request.num_preemptions > 0:  # vLLM's PrefixCacheStats counts these apart
        inst.preempted_lookups += 1
        return
    tokens = request.num_tokens
    inst.rec.lookup(tokens, gpu_hit=num_hits, host_hit=min(host, tokens - num_hits))


SPEC = AdapterSpec(COMPONENT, ("KVCacheManager",), (
    Hook("record_prefix_cache_stats", ("request", "num_hits"), "lookup", after=_recorded),
), state=("block_pool", "prefix_cache_lookup_enabled"))


def instrument_lookups(manager: Any, rec: Recorder,
                       host_hits: HostHits | None = None) -> LookupInstrumentation:
    """Count every admitted request's prefix lookup of ``manager`` into ``rec``.

    Counted as vLLM's ``PrefixCacheStats`` counts them (``queries`` / ``hits``): requests
    admitted with a prefix-cache lookup, first admissions only (re-admissions after a
    preemption are tallied in ``preempted_lookups``), whether or not ``log_stats`` is on.

    Args:
        manager: the scheduler's ``KVCacheManager``.
        rec: the recorder.
        host_hits: host hits to attribute (from the offloading manager adapter).

    Raises:
        AdapterError: ``manager`` is not a KVCacheManager or is already instrumented.

    Example:
        >>> inst = instrument_lookups(scheduler.kv_cache_manager, rec)  # doctest: +SKIP
        >>> rec.snapshot().lookups.gpu_hit                             # doctest: +SKIP
        64
    """
    def make(active: bool) -> LookupInstrumentation:
        inst = LookupInstrumentation(manager, COMPONENT, active, rec)
        inst.host_hits = host_hits
        return inst

    return instrument(manager, SPEC, make)
