"""LMCache 0.5.6 ``LMCacheEngine`` -> lookups, the host tier and its transfers.

What a connector calls is the engine: ``lookup`` (one per request, from the scheduler's
lookup client), ``retrieve``, ``lookup_unpin``, ``store``, ``clear``. kvobs wraps:

* the engine's ``lookup``: one ``rec.lookup`` per call, of the tokens LMCache counts
  (``len(tokens)``, or ``sum(offsets)`` when the lookup client sends chunk hashes) with
  the hit tokens LMCache returns: those found in the ``LocalCPUBackend`` (the first
  backend LMCache probes) as ``host_hit``, the rest of the prefix (any later backend:
  local disk, remote) as ``disk_hit``, with the chunk hashes LMCache asked the backend
  for as the reuse profile's keys (a layerwise lookup asks per chunk and stops at the
  first miss: its keys are then LMCache's chunking of the same arguments,
  ``token_database.process_tokens``, one per chunk, and the profile's size is the host
  tier's chunks, its blocks over the layers; chunks stored with no lookup:
  :mod:`.backend`). A lookup of an unhealthy engine (LMCache answers 0 without counting
  it) is not counted either;
* the engine's ``post_init``, where LMCache builds its ``StorageManager``: the
  ``LocalCPUBackend`` is instrumented there (:mod:`kvobs.adapters.lmcache.backend`), or
  at once if the engine is already post-initialised;
* the engine's GPU connector: ``batched_from_gpu`` is a gpu->host transfer of the chunks
  a ``store`` copies, ``batched_to_gpu`` a host->gpu transfer of the chunks a
  ``retrieve`` loads, with their ``MemoryObj`` bytes;
* the stats monitor's ``on_store_finished`` / ``on_retrieve_finished``: their seconds are
  LMCache's own ``from_gpu_time`` / ``to_gpu_time`` (its timing around the connector
  call; kvobs times nothing itself);
* the engine's ``store``: each chunk it drops is one ``drop`` on the gpu->host link.
  LMCache allocates a store's chunks one by one in the ``LocalCPUBackend``; when one
  allocation returns None (no free room and nothing evictable: chunks pinned or in use)
  it stops there, and that chunk and every later one of the call are not stored (with
  none allocated, it returns before copying anything). kvobs does not re-derive
  LMCache's chunking: the backend's ``allocate`` hook notes a refusal (a counter and the
  failing thread), the ``store`` hook compares that counter before and after the call
  (the whole cost when nothing failed), and only when a refusal happened in the storing
  thread during the call asks LMCache's own ``token_database.process_tokens`` (pure: it
  only hashes) for the call's non-empty chunks, less those the call copied (its
  ``batched_from_gpu``, seen by the connector hook in the same thread; none when the
  first allocation failed). Stores LMCache skips (unhealthy, passive, frozen) allocate
  nothing and count nothing; without an instrumented GPU connector nothing is counted
  (the copied chunks would be unknown).

With ``use_layerwise`` the copies and the stores are generators, stepped once per layer
of the forward pass: the connector's two copy calls return :class:`LayerCopies` (a layer
counted as its step returns, no seconds), and the engine's ``store_layer`` returns a
:class:`_StoreLayerSteps`, whose first step (where LMCache allocates every chunk's layers
with ``batched_allocate``) counts the drops
(:meth:`LMCacheEngineInstrumentation.count_layer_drops`). The reuse profile then counts
chunks, and its size is the host tier's chunks (its blocks over the layers).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

from kvobs.adapters.api import (
    MARKER,
    AdapterError,
    AdapterSpec,
    Hook,
    Instrumentation,
    begin,
    guarded,
    instrument,
    warn_once,
)
from kvobs.adapters.lmcache.backend import (
    LMCacheInstrumentation,
    instrument_local_cpu_backend,
    object_bytes,
)
from kvobs.events import NULL_LINK, LinkEvents
from kvobs.recorder import Recorder
from kvobs.tiers import GPU, HOST

COMPONENT = "lmcache.engine"
#: Storage backends whose ``contains`` kvobs may ask (local lookups, no I/O): a layerwise
#: store's drops are counted only where every backend is one of these.
LOCAL_BACKENDS = {"LocalCPUBackend", "LocalDiskBackend"}
_NO_LAYER_DROPS = "; the chunks a store_layer finds no room for are not counted"
CONNECTOR_COMPONENT = "lmcache.gpu_connector"
MONITOR_COMPONENT = "lmcache.stats_monitor"


class LMCacheEngineInstrumentation(Instrumentation):
    """Wrappers on one ``LMCacheEngine``, its GPU connector and the stats monitor.

    Attributes:
        backend: the ``LocalCPUBackend``'s instrumentation, once LMCache built it (None
            while it is not instrumented: every hit then counts as a host hit).
        tier_name: the tier the backend counts as.
        capacity_blocks: the capacity passed on to the backend's tier (None: read it).
        offload: the gpu->host link, where a ``store``'s dropped chunks count.
        copies_seen: the GPU connector's copies are counted (its hook fills ``copied``);
            without them a store's drops cannot be told from its stored chunks.
        copied: per thread ident, ``(copied, refusals)`` of that thread's latest
            ``batched_from_gpu`` made while some thread's allocation refusal is
            outstanding (``backend.refused_in`` not empty): what it copied (the chunks;
            layerwise, the start of the last chunk) and the backend's refusal counter then
            (:meth:`copy_seen`).
        layer_drops: a layerwise ``store_layer`` that finds no room counts its drops
            (its wrapper is in place, and every storage backend is local: kvobs asks them
            which chunks they hold).
    """

    def __init__(self, engine: Any, rec: Recorder, active: bool, tier_name: str,
                 capacity_blocks: int | None) -> None:
        super().__init__(engine, COMPONENT, active, rec)
        self.tier_name = tier_name
        self.capacity_blocks = capacity_blocks
        self.backend: LMCacheInstrumentation | None = None
        self.chunk_tokens = int(engine.config.chunk_size) if active else 0
        # a layerwise lookup asks for one key per layer of each chunk
        self.keys_per_chunk = int(engine.num_layers) if active and engine.use_layerwise else 1
        self.offload: LinkEvents = rec.link(GPU, tier_name) if active else NULL_LINK
        self.copies_seen = False
        self.copied: dict[int, tuple[int, int]] = {}
        self.layer_drops = False
        self.store_layer_wrapped = False  # _count_store_layer_drops installed

    def attach_backend(self) -> None:
        """Instrument the engine's ``LocalCPUBackend`` (once it exists)."""
        manager = self.target.storage_manager
        if self.backend is not None or manager is None:
            return
        backend = getattr(manager, "local_cpu_backend", None)
        if backend is None:
            warn_once(f"{COMPONENT}:no_local_cpu_backend", "kvobs_adapter_partial",
                      component=COMPONENT, missing="StorageManager.local_cpu_backend",
                      action="lookups and transfers counted, no host tier")
            return
        layers = self.keys_per_chunk
        # a layerwise chunk is ``layers`` memory objects, each a chunk's tokens of one
        # layer: the tier counts those objects, each worth chunk_size / layers tokens of
        # the whole model (0 where that is no whole number: token figures left out)
        exact = self.chunk_tokens % layers == 0
        inst = instrument_local_cpu_backend(
            backend, self.rec, block_tokens=self.chunk_tokens // layers if exact else 0,
            block_bytes=object_bytes(backend, backend.get_full_chunk_size_bytes()),
            capacity_blocks=self.capacity_blocks, tier=self.tier_name)
        if inst.active:                   # else one warning said why; hits count as host
            inst.keyed = bool(self.rec.profile_reuse)
            inst.layerwise = layers > 1
            if layers > 1:
                self.layer_drops = self.store_layer_wrapped and \
                    set(manager.storage_backends) <= LOCAL_BACKENDS
                if inst.keyed:            # its keys are chunks: a chunk is `layers` blocks
                    self.rec.start_reuse_profile(
                        capacity_blocks=max(inst.tier.capacity_blocks // layers, 1))
                remote = "" if self.layer_drops else _NO_LAYER_DROPS + (
                    " (a storage backend other than LMCache's local CPU and disk ones)"
                    if self.store_layer_wrapped else " (a GPU connector kvobs does not know)")
                tokens = (f"each holds {self.chunk_tokens // layers} tokens" if exact else
                          f"its capacity in tokens is left out ({self.chunk_tokens} tokens "
                          f"over {layers} layers is no whole number per block)")
                warn_once(f"{COMPONENT}:layerwise:{layers}:{self.chunk_tokens}",
                          "kvobs_adapter_partial",
                          component=COMPONENT, setting="use_layerwise",
                          problem=f"the host tier's blocks are LMCache's memory objects, one "
                                  f"layer of a chunk each ({layers} per chunk): {tokens}; "
                                  f"the reuse profile counts chunks (a chunk's "
                                  f"{layers} blocks as one key){remote}; LMCache times "
                                  f"no layerwise copy: the host pool's onload seconds "
                                  f"(its net benefit) stay unknown",
                          action="host tier (capacity, occupancy, allocations, stores, "
                                 "hits, evictions), lookups and the copies layer by layer "
                                 "(blocks, bytes)"
                                 + (", and their drops," if self.layer_drops else "")
                                 + " counted")
            self.backend = inst
            self.on_unwrap(inst.unwrap)

    def copy_seen(self, backend: LMCacheInstrumentation, copied: int) -> None:
        """The GPU connector copied for a store while an allocation refusal is outstanding
        (the connector hook tests that first): what it copied (a ``store``'s chunks; a
        layerwise ``store_layer``'s last chunk start) is remembered if the refusal was in
        this thread, with the backend's refusal counter now."""
        ident = threading.get_ident()
        if ident in backend.refused_in:
            self.copied[ident] = (copied, backend.refusals)

    def _cut_short(self, backend: LMCacheInstrumentation, refusals: int,
                   nothing: int) -> int | None:
        """After a store call during which the backend's refusal counter moved from
        ``refusals``: what its connector copied in it (:meth:`copy_seen`; ``nothing``
        where it copied nothing), or None where the call dropped nothing of this
        backend's (the refusal was another thread's or an older one, or the store
        allocates elsewhere: PD). Forgets this thread's notes either way."""
        ident = threading.get_ident()
        refused_at = backend.refused_in.pop(ident, 0)
        copied, stamp = self.copied.pop(ident, (nothing, 0))
        if refused_at <= refusals or getattr(self.target.storage_manager,
                                             "allocator_backend", None) is not backend.target:
            return None
        return copied if stamp > refusals else nothing   # a copy before the call: not its

    def count_drops(self, backend: LMCacheInstrumentation, refusals: int, tokens: Any,
                    hashes: Any, offsets: Any, mask: Any, request_configs: Any) -> None:
        """Count, on the gpu->host link, the chunks of a ``store`` call that LMCache did
        not store; called after the call when the backend's refusal counter
        (``refusals`` before it) moved.

        The call dropped chunks only if an ``allocate`` in this thread was refused during
        it (a later refusal than ``refusals``) and LMCache's allocations go to this
        backend; then it stored the chunks its connector copied during it (a copy noted
        after ``refusals``, else none) and dropped every other non-empty chunk LMCache's
        ``process_tokens`` makes of the same arguments.
        """
        stored = self._cut_short(backend, refusals, 0)
        if stored is None:
            return
        chunks = sum(1 for start, end, _key in self.target.token_database.process_tokens(
            tokens, hashes, offsets, mask, request_configs=request_configs) if end > start)
        dropped = chunks - stored
        if dropped > 0:
            self.offload.drop(dropped)

    @guarded(COMPONENT)
    def count_layer_drops(self, backend: LMCacheInstrumentation, refusals: int, tokens: Any,
                          mask: Any, request_configs: Any) -> None:
        """Count, on the gpu->host link, the objects of the chunks a layerwise
        ``store_layer`` did not store; called after its first step (where LMCache
        allocates every chunk's layers) when the backend's refusal counter (``refusals``
        before it) moved. A failure here is counted under ``lmcache.engine`` and the
        store goes on (:func:`~kvobs.adapters.api.guarded`).

        LMCache walks the call's chunks in order, skips those it holds already, allocates
        the layers of each other one and stops at the first allocation refused: the
        chunks before that were stored or held, and every chunk from there on that no
        backend holds is dropped (the refused one, and those LMCache never reached), each
        ``num_layers`` objects. The chunks the call stores are not yet put when this
        runs; they all start at or before the last one its connector copies. Exact but in
        one case: a chunk the call skipped as held that LMCache evicted while making room
        for the refused one (it evicts a whole chunk and retries, so only where objects
        differ in size, a partial chunk, or another thread evicted it meanwhile) counts
        as dropped.
        """
        last = self._cut_short(backend, refusals, -1)
        if last is None:
            return
        engine = self.target
        layers, where = self.keys_per_chunk, engine.retrieve_locations
        held = engine.storage_manager.contains
        dropped = sum(1 for start, end, key in engine.token_database.process_tokens(
            tokens=tokens, mask=mask, request_configs=request_configs)
            if end > start and start > last and not held(key.split_layers(layers)[0], where))
        if dropped:
            self.offload.drop(dropped * layers)


# --- readers of the engine ------------------------------------------------------------

def _looking_up(inst: LMCacheEngineInstrumentation, tokens: Any = None, hashes: Any = None,
                offsets: Any = None, *args: Any, **kwargs: Any) -> int | None:
    if not inst.target.is_healthy():      # LMCache answers 0 and counts nothing
        return None
    backend = inst.backend
    if backend is not None:
        backend.found = 0
        backend.probe_keys = None
        backend.probing = threading.get_ident()
    return len(tokens) if tokens is not None else sum(offsets)


def _looked_up(inst: LMCacheEngineInstrumentation, counted: int | None, hit: int,
               tokens: Any = None, hashes: Any = None, offsets: Any = None,
               *args: Any, **kwargs: Any) -> None:
    # the engine's arguments keep their names: LMCache's lookup client passes them by keyword
    if counted is None:
        return
    backend = inst.backend
    host, keys = hit, None
    if backend is not None:               # the backends' hits form the prefix in order
        backend.probing = None
        host = min(hit, backend.found // inst.keys_per_chunk * inst.chunk_tokens)
        probed, backend.probe_keys = backend.probe_keys, None
        if backend.keyed and inst.keys_per_chunk > 1:
            # a layerwise lookup asks for each chunk's layers in turn and stops at its
            # first miss: its chunks are LMCache's chunking of the same arguments
            configs = kwargs.get("request_configs", args[3] if len(args) > 3 else None)
            probed = [key for start, end, key in inst.target.token_database.process_tokens(
                tokens=tokens, hashes=hashes, offsets=offsets, request_configs=configs)
                if end > start]
        if probed is not None and backend.keyed:
            keys = backend.looked_up(probed)
    inst.rec.lookup(counted, host_hit=host, disk_hit=hit - host, keys=keys)


def _storing(inst: LMCacheEngineInstrumentation, tokens: Any = None, hashes: Any = None,
             offsets: Any = None, mask: Any = None, *args: Any, **kwargs: Any) -> int | None:
    backend = inst.backend
    if backend is None or not inst.copies_seen:
        return None
    return backend.refusals


def _stored(inst: LMCacheEngineInstrumentation, refusals: int | None, result: Any,
            tokens: Any = None, hashes: Any = None, offsets: Any = None, mask: Any = None,
            *args: Any, **kwargs: Any) -> None:
    backend = inst.backend
    if refusals is None or backend is None or backend.refusals == refusals:
        return                            # nothing refused: every chunk was stored
    inst.count_drops(backend, refusals, tokens, hashes, offsets, mask,
                     kwargs.get("request_configs"))


def _optional(target: Any, spec: AdapterSpec,
              make: Callable[[], Instrumentation]) -> list[Instrumentation]:
    """``[make()]`` (which instruments ``target`` as ``spec`` says), or ``[]`` with one
    warning when ``target`` is not of a kind kvobs knows (a custom GPU connector): the
    rest still counts."""
    try:
        return [make()]
    except AdapterError as exc:
        warn_once(f"{spec.component}:{type(target).__qualname__}", "kvobs_adapter_partial",
                  component=spec.component, problem=str(exc), action="not counted")
        return []


def _post_inited(inst: LMCacheEngineInstrumentation, state: None, result: Any,
                 *args: Any, **kwargs: Any) -> None:
    inst.attach_backend()


SPEC = AdapterSpec(COMPONENT, ("LMCacheEngine",), (
    Hook("lookup", ("tokens", "hashes", "offsets"), "lookup", before=_looking_up,
         after=_looked_up),
    Hook("post_init", (), "track", after=_post_inited),
    Hook("store", ("tokens", "hashes", "offsets", "mask"), "drop", before=_storing,
         after=_stored),
), state=("config.chunk_size", "storage_manager", "gpu_connector", "stats_monitor",
          "use_layerwise", "num_layers", "is_healthy", "token_database"))


# --- readers of the GPU connector (the copies) -------------------------------------------

class _LinkInstrumentation(Instrumentation):
    """Wrappers whose events go to the engine's transfer links."""

    def __init__(self, target: Any, component: str, active: bool, rec: Recorder,
                 tier_name: str, engine: LMCacheEngineInstrumentation | None = None) -> None:
        super().__init__(target, component, active, rec)
        self.offload = rec.link(GPU, tier_name)
        self.onload = rec.link(tier_name, GPU)
        self.engine = engine              # the connector's engine: its copies tell drops

    @guarded(CONNECTOR_COMPONENT)
    def layers_copied_for(self, engine: LMCacheEngineInstrumentation,
                          backend: LMCacheInstrumentation, starts: Any) -> None:
        """A layerwise ``batched_from_gpu`` while an allocation refusal is outstanding:
        tell ``engine`` the start of the last chunk it copies (which chunks its
        ``store_layer`` stored). A failure is counted under ``lmcache.gpu_connector`` and
        the copy goes on."""
        engine.copy_seen(backend, max(starts, default=-1))


def _chunks(memory_objs: Any) -> tuple[int, int]:
    """``(chunks, bytes)`` of a flat list of ``MemoryObj`` (a layerwise connector, whose
    copies are layer-major lists moved by its generator, is :class:`LayerCopies`')."""
    if not memory_objs:
        return 0, 0
    return len(memory_objs), sum(obj.get_size() for obj in memory_objs)


def _copied_from_gpu(inst: _LinkInstrumentation, state: None, result: Any, memory_objs: Any,
                     *args: Any, **kwargs: Any) -> None:
    chunks, nbytes = _chunks(memory_objs)
    if chunks:
        inst.offload.transfer(chunks, nbytes)
    engine = inst.engine
    if engine is not None:                # an allocation was refused: the store counts drops
        backend = engine.backend
        if backend is not None and backend.refused_in:
            engine.copy_seen(backend, chunks)


def _copied_to_gpu(inst: _LinkInstrumentation, state: None, result: Any,
                   memory_objs: Any = None, *args: Any, **kwargs: Any) -> None:
    chunks, nbytes = _chunks(memory_objs)
    if chunks:
        inst.onload.transfer(chunks, nbytes)


CONNECTOR_SPEC = AdapterSpec(CONNECTOR_COMPONENT, ("GPUConnectorInterface",), (
    Hook("batched_from_gpu", ("memory_objs", "starts", "ends"), "transfer",
         after=_copied_from_gpu),
    Hook("batched_to_gpu", ("memory_objs", "starts", "ends"), "transfer",
         after=_copied_to_gpu),
))


# --- a layerwise connector's copies (generators, one layer per step) ----------------------

class _EngineSteps:
    """An engine generator stepped through a proxy: every value, exception (``StopIteration``
    included), ``throw`` and ``close`` is the engine's own; subclasses read around
    :meth:`send`."""

    __slots__ = ("_steps",)

    def __init__(self, steps: Any) -> None:
        self._steps = steps

    def __iter__(self) -> _EngineSteps:
        return self

    def __next__(self) -> Any:
        return self.send(None)

    def send(self, value: Any) -> Any:
        return self._steps.send(value)

    def throw(self, *args: Any) -> Any:
        return self._steps.throw(*args)

    def close(self) -> None:
        self._steps.close()


class LayerCopies(_EngineSteps):
    """A layerwise GPU connector's copy generator, counted layer by layer as LMCache
    drives it (``store_layer`` / ``retrieve_layer`` step it once per model layer).

    Out (``batched_from_gpu(memory_objs, starts, ends)``, ``memory_objs`` layer-major):
    the k-th step copies layer k-1 of every chunk, so it counts ``memory_objs[k-1]``.
    In (``batched_to_gpu(starts, ends)``): LMCache sends each layer's memory objects, and
    the step that receives them copies them, so it counts what was sent. A layer counts
    once its step returned (a step that raised copied nothing kvobs can vouch for), one
    transfer of that layer's objects (the host tier's blocks) and their bytes (read on the
    first layer: LMCache allocates every layer of a chunk in one shape), no seconds
    (LMCache times no layerwise copy). Every other use of the generator (its
    values, ``throw``, ``close``, ``StopIteration``) is the engine's, unchanged; a
    failure while counting is counted under ``lmcache.gpu_connector``
    (:func:`~kvobs.adapters.api.guarded`, in ``rec``) and the copy goes on.

    Example:
        >>> from kvobs.recorder import Recorder
        >>> class Obj:
        ...     def get_size(self): return 64
        >>> def copy_in():                  # what a layerwise batched_to_gpu does
        ...     while True:
        ...         objs = yield            # one layer's objects, copied on resume
        >>> rec = Recorder()
        >>> inst = _LinkInstrumentation(None, CONNECTOR_COMPONENT, True, rec, "host")
        >>> moves = LayerCopies(copy_in(), inst)
        >>> next(moves); moves.send([Obj(), Obj()]); moves.send([Obj(), Obj()])
        >>> link = rec.snapshot().link("host", "gpu"); link.blocks, link.bytes, link.seconds
        (4, 256, 0.0)
    """

    __slots__ = ("_done", "_inst", "_layer_bytes", "_out", "rec")

    def __init__(self, copies: Any, inst: _LinkInstrumentation, out: Any = None) -> None:
        super().__init__(copies)
        self._inst = inst
        self.rec = inst.rec      # where a failure while counting is counted
        self._out = out          # out: the layer-major lists; in: None (sent per layer)
        self._done = 0           # out: steps returned
        self._layer_bytes = -1   # one layer's bytes, once read

    def send(self, value: Any) -> Any:
        """Step the engine's generator with ``value``; count the layer the step copied."""
        result = self._steps.send(value)
        self._copied(value)
        return result

    @guarded(CONNECTOR_COMPONENT)
    def _copied(self, sent: Any) -> None:
        out = self._out
        if out is None:
            layer, link = sent, self._inst.onload
        else:
            step, self._done = self._done, self._done + 1
            if step >= len(out):          # the last step only waits for the copies
                return
            layer, link = out[step], self._inst.offload
        if layer:
            nbytes = self._layer_bytes
            if nbytes < 0:
                nbytes = self._layer_bytes = sum(obj.get_size() for obj in layer)
            chunks = len(layer)
            link.transfer(chunks, nbytes)


class _StoreLayerSteps(_EngineSteps):
    """A layerwise ``store_layer``'s generator: its first step allocates every chunk's
    layers (and copies the first); when an allocation was refused during it, the chunks
    it dropped are counted (:meth:`LMCacheEngineInstrumentation.count_layer_drops`)."""

    __slots__ = ("_call", "_inst")

    def __init__(self, steps: Any, inst: LMCacheEngineInstrumentation,
                 call: tuple[Any, Any, Any] | None) -> None:
        super().__init__(steps)
        self._inst = inst
        self._call = call        # (tokens, mask, request_configs) until the first step

    def send(self, value: Any) -> Any:
        call, self._call = self._call, None
        backend = self._inst.backend
        if call is None or backend is None:
            return self._steps.send(value)
        refusals = backend.refusals
        result = self._steps.send(value)
        if backend.refusals != refusals:  # rare: nothing more read on a step otherwise
            self._inst.count_layer_drops(backend, refusals, *call)   # guarded: never raises
        return result


def _count_store_layer_drops(inst: LMCacheEngineInstrumentation) -> None:
    """Wrap the engine's ``store_layer`` so that its generator counts its drops."""
    store_layer = inst.target.store_layer

    def counted_store_layer(tokens: Any, mask: Any = None, **kwargs: Any) -> Any:
        steps = store_layer(tokens, mask, **kwargs)
        call = (tokens, mask, kwargs.get("request_configs")) if inst.layer_drops else None
        return _StoreLayerSteps(steps, inst, call)

    functools.update_wrapper(counted_store_layer, store_layer,
                             assigned=("__name__", "__qualname__", "__doc__"), updated=())
    inst.install("store_layer", counted_store_layer)
    inst.store_layer_wrapped = True


#: A layerwise connector: its two copy calls return generators (wrapped, not read).
LAYERWISE_CONNECTOR_SPEC = AdapterSpec(CONNECTOR_COMPONENT, ("GPUConnectorInterface",), (
    Hook("batched_from_gpu", ("memory_objs", "starts", "ends"), "transfer"),
    Hook("batched_to_gpu", ("starts", "ends"), "transfer"),
))


def instrument_layer_copies(connector: Any, rec: Recorder, tier: str = HOST,
                            engine: LMCacheEngineInstrumentation | None = None
                            ) -> _LinkInstrumentation:
    """Count a layerwise GPU connector's copies layer by layer (:class:`LayerCopies`);
    with ``engine`` (its engine's instrumentation), a copy made while an allocation
    refusal is outstanding tells that engine which chunks its ``store_layer`` stored.

    Raises:
        AdapterError: not a GPU connector, or already instrumented.
    """
    spec = LAYERWISE_CONNECTOR_SPEC
    inst = begin(connector, spec.kinds, spec.hooks, spec.component,
                 lambda active: _LinkInstrumentation(connector, spec.component, active, rec,
                                                     tier, engine))
    if not inst.active:
        return inst
    copy_out, copy_in = connector.batched_from_gpu, connector.batched_to_gpu

    def batched_from_gpu(memory_objs: Any, starts: Any, ends: Any, **kwargs: Any) -> Any:
        if engine is not None and engine.layer_drops:
            backend = engine.backend
            if backend is not None and backend.refused_in:   # a store cut short: which chunks
                inst.layers_copied_for(engine, backend, starts)
        return LayerCopies(copy_out(memory_objs, starts, ends, **kwargs), inst, memory_objs)

    def batched_to_gpu(starts: Any, ends: Any, **kwargs: Any) -> Any:
        return LayerCopies(copy_in(starts, ends, **kwargs), inst)

    inst.install("batched_from_gpu", batched_from_gpu)
    inst.install("batched_to_gpu", batched_to_gpu)
    return inst


# --- readers of the stats monitor (LMCache's own timings) --------------------------------

def _store_timed(inst: _LinkInstrumentation, state: None, result: Any, store_stats: Any,
                 *args: Any, **kwargs: Any) -> None:
    seconds = store_stats.from_gpu_time
    if seconds:
        inst.offload.timed(seconds)


def _retrieve_timed(inst: _LinkInstrumentation, state: None, result: Any,
                    retrieve_stats: Any, *args: Any, **kwargs: Any) -> None:
    seconds = retrieve_stats.to_gpu_time
    if seconds:
        inst.onload.timed(seconds)


#: LMCache's ``@thread_safe`` hides these methods' parameters (``*args, **kwargs``):
#: nothing to check there; the stats objects they receive are checked by their use.
MONITOR_SPEC = AdapterSpec(MONITOR_COMPONENT, ("LMCStatsMonitor",), (
    Hook("on_store_finished", (), "transfer", after=_store_timed),
    Hook("on_retrieve_finished", (), "transfer", after=_retrieve_timed),
), state=("store_requests", "retrieve_requests"))


def instrument_lmcache_engine(engine: Any, rec: Recorder, *, tier: str = HOST,
                              capacity_blocks: int | None = None
                              ) -> LMCacheEngineInstrumentation:
    """Count an LMCache ``LMCacheEngine``: lookups, its CPU backend as tier ``tier``,
    the copies of its GPU connector and their LMCache-measured seconds.

    Call it once the engine exists (``LMCacheEngineBuilder.get_or_create``); its CPU
    backend is instrumented when LMCache's ``post_init`` builds it (at once if it has).

    Args:
        engine: the ``LMCacheEngine`` (``LMCacheEngineBuilder.get("vllm-instance")`` in
            a vLLM worker).
        rec: the recorder.
        tier: the tier name of the ``LocalCPUBackend``.
        capacity_blocks: memory objects the CPU buffer holds (chunks; layerwise, layers
            of chunks); default: read from its allocator.

    Returns:
        The instrumentation; ``unwrap()`` restores the engine, its connector, the stats
        monitor and the backend. Inactive (nothing wrapped, one warning naming what
        differs) for an engine version whose methods or state differ; a connector or
        backend of an unknown kind is left alone the same way.

    Raises:
        AdapterError: not an LMCacheEngine, or it is already instrumented.

    Example:
        >>> engine = LMCacheEngineBuilder.get("vllm-instance")            # doctest: +SKIP
        >>> inst = instrument_lmcache_engine(engine, rec)                  # doctest: +SKIP
        >>> rec.snapshot().lookups.lookups                                 # doctest: +SKIP
        0
    """
    inst = instrument(engine, SPEC, lambda active: LMCacheEngineInstrumentation(
        engine, rec, active, tier, capacity_blocks))
    if not inst.active:
        return inst
    links: list[Instrumentation] = []
    connector = engine.gpu_connector
    if connector is not None and engine.use_layerwise:   # copies moved by generators
        links += _optional(connector, LAYERWISE_CONNECTOR_SPEC,
                           lambda: instrument_layer_copies(connector, rec, tier, inst))
        if links and links[0].active:     # its copies tell which chunks a store kept
            _count_store_layer_drops(inst)
    elif connector is not None:           # None in a scheduler-side engine
        links += _optional(connector, CONNECTOR_SPEC, lambda: instrument(
            connector, CONNECTOR_SPEC, lambda active: _LinkInstrumentation(
                connector, CONNECTOR_COMPONENT, active, rec, tier, inst)))
        inst.copies_seen = bool(links) and links[0].active
    monitor = engine.stats_monitor         # one per process: with two engines, the
    if getattr(monitor, MARKER, None) is None:    # first one's links get the seconds
        links += _optional(monitor, MONITOR_SPEC, lambda: instrument(
            monitor, MONITOR_SPEC, lambda active: _LinkInstrumentation(
                monitor, MONITOR_COMPONENT, active, rec, tier)))
    for link in links:
        inst.on_unwrap(link.unwrap)
    with ExitStack() as undo:             # a backend that fails to attach: nothing stays wrapped
        undo.callback(inst.unwrap)
        inst.attach_backend()
        undo.pop_all()
    return inst
