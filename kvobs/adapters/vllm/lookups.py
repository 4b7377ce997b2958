"""vLLM 0.33 ``KVCacheManager`` prefix lookups -> lookup tokens, GPU hits and host hits.

vLLM's scheduler calls ``record_prefix_cache_stats(request, num_hits)`` once per request
it admits (after allocating its blocks), which is exactly the lookup its own prefix-cache
hit rate counts; lookups of requests that were not admitted are not counted, and
re-admissions of preempted requests go to vLLM's ``preempted_*`` figures, not to
``queries`` / ``hits``. kvobs counts the same calls the same way, whether or not
vLLM's ``log_stats`` is on: a preempted request's re-lookup is exported on its own
(``kvobs_preempted_lookup*``), and its host / disk hits count in the saved prefill (a
host hit there spares the recompute the preemption would otherwise cost).

Host and disk hits, with the whole scheduler instrumented, are split as vLLM splits its
own ``hits_by_source``: after the connector's ``update_state_after_alloc`` (which plans
the loads, just before the stats call) the connector adapter asks the connector's
``get_external_cache_hit_sources`` and leaves the split in :class:`ExternalHits` for
this adapter. A load vLLM defers (``Scheduler.deferred_loads``: its plan comes in
``update_from_output`` of a later step, after the stats call) holds the lookup until
its hits arrive. Without the connector adapter, host hits are the chunks the offloading
manager pinned for the request (:class:`HostHits`) and disk hits those the tiering
adapter saw come from disk.

Each lookup carries the request's block hashes (one per full GPU block) as keys: the
reuse-distance profile (:mod:`kvobs.reuse`), the ``KVOBS_TRACE_OUT`` trace and the
missed tokens' causes. vLLM hits at most the whole blocks before a prompt's last token
(it always computes that one), so the tokens after them are not cacheable.

The blocks a request cached beyond its prompt (its answer, written during decode) go to
the profile as ``written`` (:meth:`~kvobs.recorder.Recorder.written`) when the request's
blocks are released: ``free(request)`` (a request finished, aborted or preempted) or
``pop_blocks_for_free(request)`` (the same, its blocks returned to the pool a step later).
vLLM's own count of the request's cached blocks (the KV cache group 0 manager's
``num_cached_block``, popped by that call) says how far: the request's block hashes from
its prompt's end to there. Once per request, not once per filled block (as before, when
``BlockPool.cache_full_blocks`` reported each block as it filled).

Why at release is vLLM's LRU order: a block in use cannot be evicted, and ``free_blocks``
appends a released request's hashed blocks to the tail of the pool's free queue, whose
head ``get_new_blocks`` evicts first. So an answer's blocks take their place in vLLM's
eviction order when the request releases them, not when each filled; written then, they
enter the profile's LRU stack where they enter vLLM's queue (a lookup admitted while the
request still runs cannot evict them in vLLM, and in the profile they are not yet there
to be pushed down either). Two differences remain, as before: vLLM appends a request's
blocks tail first (its last block is evicted first) where the profile writes them in
prompt order, the order the next turn's lookup references them; and the prompt's own
blocks, which vLLM moves to the tail at the same release, stay in the profile where their
lookup referenced them. A preempted request releases its blocks at each preemption and
at its end; each release writes the answer's cached blocks again, as each moves them to
the tail of vLLM's queue (a write moves a block to the top of the stack and counts
nothing, so a block written twice is counted no more). A request that never got blocks
(aborted while waiting) has none to write.

Example:
    >>> hits = HostHits(tokens_per_chunk=64)
    >>> hits.add("req-1", chunks=2); hits.take("req-1"), hits.take("req-1")
    (128, 0)
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from kvobs.adapters.api import (
    AdapterSpec,
    Hook,
    Instrumentation,
    attr_path,
    instrument,
    warn_once,
)
from kvobs.recorder import Recorder

COMPONENT = "vllm.kv_cache_manager"


class TierHits:
    """Tokens per request found in one slower tier (host chunks pinned for loading, disk
    chunks promoted), waiting for the request's lookup record.

    Bounded: a request that never reaches the lookup record (aborted between steps) is
    forgotten after ``max_requests`` newer ones.

    Example:
        >>> hits = TierHits(tokens_per_chunk=64)
        >>> hits.add("req-1", chunks=2); hits.take("req-1"), hits.take("req-1")
        (128, 0)
    """

    def __init__(self, tokens_per_chunk: int, max_requests: int = 4096) -> None:
        self.tokens_per_chunk = tokens_per_chunk
        self.max_requests = max_requests
        self._pending: OrderedDict[str, int] = OrderedDict()
        self._lock = threading.Lock()

    def add(self, request_id: str, chunks: int) -> None:
        """``chunks`` chunks of ``request_id`` are loaded from this tier."""
        with self._lock:
            self._pending[request_id] = self._pending.get(request_id, 0) + chunks
            while len(self._pending) > self.max_requests:
                self._pending.popitem(last=False)

    def take(self, request_id: str) -> int:
        """Tokens recorded for ``request_id`` (0 if none), forgetting them."""
        with self._lock:
            return self._pending.pop(request_id, 0) * self.tokens_per_chunk


#: The host tier's pending hits (the name the offloading adapter and tests use).
HostHits = TierHits


class ExternalHits:
    """Host / disk hit tokens per request as vLLM's connector splits them, waiting for the
    request's lookup record; and lookups held until a deferred load is planned.

    The connector adapter calls :meth:`arrive` after ``update_state_after_alloc`` with the
    split of ``get_external_cache_hit_sources`` (what vLLM's ``hits_by_source`` reads);
    the lookup adapter :meth:`take` s it at ``record_prefix_cache_stats``. A load vLLM
    defers (``Scheduler.deferred_loads``) is planned after its request's lookup record:
    that lookup is :meth:`hold` ed and recorded when its hits arrive. Bounded: requests
    never recorded (aborted between steps) are forgotten after ``max_requests`` newer ones.

    Example:
        >>> from kvobs.recorder import Recorder
        >>> rec = Recorder()
        >>> hits = ExternalHits(rec)
        >>> hits.arrive("r1", host=32, disk=16); hits.take("r1"), hits.take("r1")
        ((32, 16), (0, 0))
        >>> hits.hold("r2", tokens=100, gpu_hit=16, keys=None)  # a deferred load
        >>> hits.arrive("r2", host=48, disk=0); rec.snapshot().lookups.host_hit
        48
    """

    def __init__(self, rec: Recorder, max_requests: int = 4096) -> None:
        self.rec = rec
        self.max_requests = max_requests
        #: request id -> (host, disk) hit tokens planned, not yet taken (the lookup reader
        #: pops it inline: one Python frame less per admitted request)
        self.pending: dict[str, tuple[int, int]] = {}
        self._held: dict[str, tuple[int, int, Sequence[Any] | None, bool]] = {}

    def arrive(self, request_id: str, host: int, disk: int) -> None:
        """``request_id``'s external hits were planned: ``host`` / ``disk`` tokens."""
        held = self._held.pop(request_id, None)
        if held is not None:
            tokens, gpu_hit, keys, preempted = held
            if preempted:
                relookup(self.rec, tokens, gpu_hit, host, disk)
            else:
                self.rec.lookup(tokens, gpu_hit=gpu_hit, host_hit=host, disk_hit=disk,
                                keys=keys, cacheable_tokens=tokens - 1)
            return
        pending = self.pending
        pending[request_id] = (host, disk)
        if len(pending) > self.max_requests:
            del pending[next(iter(pending))]

    def take(self, request_id: str) -> tuple[int, int]:
        """``(host, disk)`` hit tokens planned for ``request_id`` (zeros if none); forgets."""
        return self.pending.pop(request_id, _NO_HITS)

    def hold(self, request_id: str, tokens: int, gpu_hit: int,
             keys: Sequence[Any] | None, preempted: bool = False) -> None:
        """Record ``request_id``'s lookup (``preempted``: re-lookup) when its (deferred)
        hits arrive."""
        held = self._held
        held[request_id] = (tokens, gpu_hit, keys, preempted)
        if len(held) > self.max_requests:
            del held[next(iter(held))]

    @property
    def held(self) -> int:
        """Lookups waiting for a deferred load to be planned."""
        return len(self._held)


_NO_HITS = (0, 0)


class LookupInstrumentation(Instrumentation):
    """Wrappers on ``KVCacheManager.record_prefix_cache_stats`` (the lookups) and on its
    releases of a request's blocks (``free``, ``pop_blocks_for_free``: the blocks it wrote
    during decode, into the reuse profile; see the module docstring).

    Re-lookups of preempted requests, which vLLM's hit rate (and so kvobs's lookup
    series) leaves out, go to :meth:`~kvobs.recorder.Recorder.relookup`: their own series,
    their host and disk hits in the saved prefill. Where the hits come from: ``external``
    (the connector's own split, see :class:`ExternalHits`; with ``deferred``, the
    scheduler's ``deferred_loads``) when the connector is instrumented, else the chunks
    the offloading manager pinned (``host_hits``) of which ``disk_hits`` came from disk
    (the tiering adapter's).
    """

    host_hits: HostHits | None = None
    disk_hits: TierHits | None = None  # left by the tiering adapter
    external: ExternalHits | None = None
    deferred: Any = None  # Scheduler.deferred_loads
    keyed: bool = True  # pass the request's block hashes (reuse profile, trace)

    def __init__(self, target: Any, component: str, active: bool = True,
                 rec: Any = None) -> None:
        super().__init__(target, component, active, rec)
        #: whether the blocks a request wrote during decode are reported at its release
        #: (the release wrappers' gate: False, no reader runs)
        self.writes = False
        #: vLLM's cached blocks per request id (KV cache group 0), its hashes per block
        #: and tokens per hash
        self.cached_blocks: dict[str, int] = {}
        self.hashes_per_block = 1
        self.hash_size = 1
        #: the recorder's ``written_pending`` (the C reader appends there while it fits)
        self.written_to: list[Any] | None = None


def _recorded(inst: LookupInstrumentation, state: None, result: None, request: Any,
              num_hits: int) -> None:
    if not inst.target.prefix_cache_lookup_enabled(request):
        return
    request_id = request.request_id
    external = inst.external
    if external is not None:
        host, disk = external.pending.pop(request_id, _NO_HITS)  # external.take, inline
    else:
        pinned = inst.host_hits.take(request_id) if inst.host_hits is not None else 0
        disk = inst.disk_hits.take(request_id) if inst.disk_hits is not None else 0
        host = pinned - disk  # chunks promoted from disk are pinned in the host tier too
    tokens = request.num_tokens
    preempted = request.num_preemptions > 0  # vLLM's PrefixCacheStats counts these apart
    keys = request.block_hashes if inst.keyed and not preempted else None
    deferred = inst.deferred
    if deferred and external is not None and request_id in deferred:
        external.hold(request_id, tokens, num_hits, None if keys is None else list(keys),
                      preempted)
        return
    if preempted:
        relookup(inst.rec, tokens, num_hits, host, disk)
        return
    left = tokens - num_hits
    host = min(host, left)
    inst.rec.lookup(tokens, gpu_hit=num_hits, host_hit=host, disk_hit=min(disk, left - host),
                    keys=keys, cacheable_tokens=tokens - 1)  # vLLM computes the last token


def relookup(rec: Recorder, tokens: int, gpu_hit: int, host: int, disk: int) -> None:
    """A preempted request's re-lookup (its own series; its host / disk hits saved), the
    hits split as a first lookup's are."""
    left = tokens - gpu_hit
    host = min(host, left)
    rec.relookup(tokens, gpu_hit=gpu_hit, host_hit=host, disk_hit=min(disk, left - host))


def _release_before(inst: LookupInstrumentation, request: Any,
                    *args: Any, **kwargs: Any) -> Any:
    """Before ``free`` / ``pop_blocks_for_free``: the block hashes of what ``request``
    cached beyond its prompt (vLLM's count, which the call pops), or None."""
    end = inst.cached_blocks.get(request.request_id, 0) * inst.hashes_per_block
    start = request.num_prompt_tokens // inst.hash_size
    return request.block_hashes[start:end] if start < end else None


def _release_after(inst: LookupInstrumentation, keys: Any, result: Any, request: Any,
                   *args: Any, **kwargs: Any) -> None:
    """The call returned: the blocks are released, written into the profile's stack."""
    if keys:
        inst.rec.written(keys)


SPEC = AdapterSpec(COMPONENT, ("KVCacheManager",), (
    Hook("record_prefix_cache_stats", ("request", "num_hits"), "lookup", after=_recorded),
    Hook("free", ("request",), "track", before=_release_before, after=_release_after,
         when=attr_path("writes")),
    Hook("pop_blocks_for_free", ("request",), "track", before=_release_before,
         after=_release_after, when=attr_path("writes"), optional=True),
), state=("block_pool", "prefix_cache_lookup_enabled"))
"""The lookup, and the releases that write a request's answer into the reuse profile
(gated: no reader runs while nothing is reported)."""


def instrument_lookups(manager: Any, rec: Recorder, host_hits: HostHits | None = None, *,
                       external: ExternalHits | None = None, deferred: Any = None,
                       keyed: bool = True) -> LookupInstrumentation:
    """Count every admitted request's prefix lookup of ``manager`` into ``rec``.

    Counted as vLLM's ``PrefixCacheStats`` counts them (``queries`` / ``hits``): requests
    admitted with a prefix-cache lookup, first admissions only (re-admissions after a
    preemption are re-lookups, :meth:`~kvobs.recorder.Recorder.relookup`: their own
    series, their host hits in the saving), whether or not ``log_stats`` is on.
    Each lookup carries the request's block hashes (``request.block_hashes``: one per
    full GPU block of its tokens, in order) as keys, for the reuse-distance profile and
    the ``KVOBS_TRACE_OUT`` trace (``keyed=False``: none).

    Args:
        manager: the scheduler's ``KVCacheManager``.
        rec: the recorder.
        host_hits: host hits to attribute (from the offloading manager adapter).
        external: host / disk hits as the connector splits them (from the connector
            adapter; replaces ``host_hits``).
        deferred: the scheduler's ``deferred_loads`` (lookups of deferred loads wait
            for their hits in ``external``).
        keyed: pass block hashes with each lookup.

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
        inst.external = external
        inst.deferred = deferred
        inst.keyed = keyed
        if active:
            rec.track_relookups()
            _find_cached_blocks(inst, manager, rec)
        return inst

    return instrument(manager, SPEC, make)


def _find_cached_blocks(inst: LookupInstrumentation, manager: Any, rec: Recorder) -> None:
    """Where vLLM counts a request's cached blocks (its KV cache group 0 manager), read
    once: with a reuse profile, the releases then report written blocks. A manager laid
    out otherwise reports none, with one warning."""
    if not rec.profile_reuse:
        return
    try:
        group = manager.coordinator.single_type_managers[0]
        cached, block_size = group.num_cached_block, int(group.block_size)
        hash_size = int(manager.block_pool.hash_block_size)
        if not isinstance(cached, dict) or hash_size <= 0 or block_size % hash_size:
            raise ValueError("num_cached_block / block sizes")
    except (AttributeError, IndexError, TypeError, ValueError) as exc:
        warn_once(f"{COMPONENT}:num_cached_block", "kvobs_instrument_partial",
                  component=COMPONENT, missing=str(exc),
                  effect="the reuse profile gets no decode-written blocks")
        return
    inst.cached_blocks = cached
    inst.hashes_per_block = block_size // hash_size
    inst.hash_size = hash_size
    inst.written_to = rec.written_pending
    inst.writes = True
