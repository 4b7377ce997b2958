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
* the chunks a ``store`` drops: one ``drop`` each on the gpu->host link, and no hook
  on ``store`` itself. LMCache allocates a store's chunks one by one in the
  ``LocalCPUBackend``; when one allocation returns None (no free room and nothing
  evictable: chunks pinned or in use) it stops there, and that chunk and every later
  one of the call are not stored (with none allocated, it returns before copying
  anything). The backend's ``allocate`` hook sees the refusal; only then (a rare path)
  kvobs looks for this engine's ``store`` among the calls of the refused thread
  (:meth:`LMCacheEngineInstrumentation.count_drops`) and reads, in that call, its
  arguments and the chunks it allocated so far (its ``memory_objs``): the dropped
  chunks are the call's non-empty chunks, as LMCache's own
  ``token_database.process_tokens`` (pure: it only hashes) makes them of the same
  arguments, less those. A refusal outside a ``store`` (another thread's, a retrieve's)
  drops nothing; stores LMCache skips (unhealthy, passive, frozen) allocate nothing and
  count nothing. An LMCache whose ``store`` keeps other locals counts no drops (one
  warning says so);

With ``use_layerwise`` the copies and the stores are generators, stepped once per layer
of the forward pass: the connector's two copy calls return :class:`LayerCopies` (a layer
counted as its step returns, no seconds), and a ``store_layer`` whose first step (where
LMCache allocates every chunk's layers with ``batched_allocate``) is refused room counts
its drops as a ``store`` does (:meth:`LMCacheEngineInstrumentation.count_drops`). The
reuse profile then counts chunks, and its size is the host tier's chunks (its blocks
over the layers).
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable
from contextlib import ExitStack
from types import CodeType, FrameType
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
#: The locals of LMCache's ``LMCacheEngine.store`` and ``store_layer`` that a refused
#: allocation reads there (:meth:`LMCacheEngineInstrumentation.count_drops`).
STORE_LOCALS = {"store": frozenset({"self", "tokens", "hashes", "offsets", "mask", "kwargs",
                                    "memory_objs"}),
                "store_layer": frozenset({"self", "tokens", "mask", "kwargs", "start"})}
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
        copies_seen: the GPU connector's copies are counted.
        stores: the code of LMCacheEngine's ``store`` and ``store_layer`` beneath their
            decorators, by code, where they keep the locals :meth:`count_drops` reads
            (one missing: its drops are not counted, one warning says so).
        layer_drops: a layerwise ``store_layer`` that finds no room counts its drops
            (its code is readable, and every storage backend is local: kvobs asks them
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
        self.stores: dict[CodeType, str] = _store_codes(engine) if active else {}
        self.layer_drops = False

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
            if self.stores:
                inst.on_refused = self.count_drops
            inst.keyed = bool(self.rec.profile_reuse)
            inst.layerwise = layers > 1
            if layers > 1:
                readable = "store_layer" in self.stores.values()
                self.layer_drops = readable and set(manager.storage_backends) <= LOCAL_BACKENDS
                if inst.keyed:            # its keys are chunks: a chunk is `layers` blocks
                    self.rec.start_reuse_profile(
                        capacity_blocks=max(inst.tier.capacity_blocks // layers, 1))
                remote = "" if self.layer_drops else _NO_LAYER_DROPS + (
                    " (a storage backend other than LMCache's local CPU and disk ones)"
                    if readable else " (a store_layer kvobs cannot read)")
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

    @guarded(COMPONENT)
    def count_drops(self) -> None:
        """An allocation of the backend was refused in this thread (the backend's
        ``allocate`` hook calls this then, a rare path): if it was this engine's ``store``
        or ``store_layer`` allocating a chunk, count on the gpu->host link what that call
        drops. A failure here is counted under ``lmcache.engine``, never raised.

        The call is found among the thread's frames by its code and its engine (a refusal
        outside one finds none and drops nothing) and read there as LMCache holds it:
        its arguments and how far it got. Both stop at the refused chunk, and only where
        LMCache allocates in this backend (not with ``enable_pd``, whose ``PDBackend``
        does):

        * ``store`` stores the chunks it allocated before (its ``memory_objs``); every
          other non-empty chunk LMCache's ``process_tokens`` makes of its arguments is
          dropped;
        * ``store_layer`` allocates every layer of each chunk no backend holds, in order,
          and skips the held ones: the refused chunk (its ``start``) and every later one
          no backend holds are dropped, ``num_layers`` objects each. Exact but in one
          case: a later chunk held when the call began that LMCache evicted while making
          room for the refused one (it evicts whole chunks and retries until nothing is
          left to evict), or another thread evicted meanwhile, counts as dropped.
        """
        stores, engine = self.stores, self.target
        frame: FrameType | None = inspect.currentframe()
        while frame is not None and not (frame.f_code in stores and
                                         frame.f_locals.get("self") is engine):
            frame = frame.f_back
        backend = self.backend
        if frame is None or backend is None or getattr(
                engine.storage_manager, "allocator_backend", None) is not backend.target:
            return                        # not a store of this engine's chunks here
        call = frame.f_locals
        configs = call["kwargs"].get("request_configs")
        if stores[frame.f_code] == "store":
            chunks = sum(1 for start, end, _key in engine.token_database.process_tokens(
                call["tokens"], call["hashes"], call["offsets"], call["mask"],
                request_configs=configs) if end > start)
            stored = len(call["memory_objs"])
            dropped = chunks - stored
            if dropped > 0:
                self.offload.drop(dropped)
        elif self.layer_drops:
            refused, layers = call["start"], self.keys_per_chunk
            where, held = engine.retrieve_locations, engine.storage_manager.contains
            dropped = sum(1 for start, end, key in engine.token_database.process_tokens(
                tokens=call["tokens"], mask=call["mask"], request_configs=configs)
                if end > start and start >= refused and
                not held(key.split_layers(layers)[0], where))
            if dropped:
                self.offload.drop(dropped * layers)


def _store_codes(engine: Any) -> dict[CodeType, str]:
    """The code of the engine's ``store`` and ``store_layer`` beneath their decorators,
    where each keeps the locals :meth:`LMCacheEngineInstrumentation.count_drops` reads
    (:data:`STORE_LOCALS`); one missing is left out with one warning: the chunks it drops
    are not counted."""
    codes = {}
    for name, names in STORE_LOCALS.items():
        method = getattr(type(engine), name, None)
        code = getattr(inspect.unwrap(method), "__code__", None) if callable(method) else None
        if isinstance(code, CodeType) and set(code.co_varnames) >= names:
            codes[code] = name
            continue
        warn_once(f"{COMPONENT}:{name}_locals:{type(engine).__qualname__}",
                  "kvobs_adapter_partial", component=COMPONENT,
                  missing=f"LMCacheEngine.{name}'s locals {sorted(names)}",
                  action=f"the chunks a {name} drops are not counted; the rest is")
    return codes


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
), state=("config.chunk_size", "storage_manager", "gpu_connector", "stats_monitor",
          "use_layerwise", "num_layers", "is_healthy", "token_database"))


# --- readers of the GPU connector (the copies) -------------------------------------------

class _LinkInstrumentation(Instrumentation):
    """Wrappers whose events go to the engine's transfer links."""

    def __init__(self, target: Any, component: str, active: bool, rec: Recorder,
                 tier_name: str) -> None:
        super().__init__(target, component, active, rec)
        self.offload = rec.link(GPU, tier_name)
        self.onload = rec.link(tier_name, GPU)


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


#: A layerwise connector: its two copy calls return generators (wrapped, not read).
LAYERWISE_CONNECTOR_SPEC = AdapterSpec(CONNECTOR_COMPONENT, ("GPUConnectorInterface",), (
    Hook("batched_from_gpu", ("memory_objs", "starts", "ends"), "transfer"),
    Hook("batched_to_gpu", ("starts", "ends"), "transfer"),
))


def instrument_layer_copies(connector: Any, rec: Recorder, tier: str = HOST
                            ) -> _LinkInstrumentation:
    """Count a layerwise GPU connector's copies layer by layer (:class:`LayerCopies`).

    Raises:
        AdapterError: not a GPU connector, or already instrumented.
    """
    spec = LAYERWISE_CONNECTOR_SPEC
    inst = begin(connector, spec.kinds, spec.hooks, spec.component,
                 lambda active: _LinkInstrumentation(connector, spec.component, active, rec,
                                                     tier))
    if not inst.active:
        return inst
    copy_out, copy_in = connector.batched_from_gpu, connector.batched_to_gpu

    def batched_from_gpu(memory_objs: Any, starts: Any, ends: Any, **kwargs: Any) -> Any:
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
                           lambda: instrument_layer_copies(connector, rec, tier))
    elif connector is not None:           # None in a scheduler-side engine
        links += _optional(connector, CONNECTOR_SPEC, lambda: instrument(
            connector, CONNECTOR_SPEC, lambda active: _LinkInstrumentation(
                connector, CONNECTOR_COMPONENT, active, rec, tier)))
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
