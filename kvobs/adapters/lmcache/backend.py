"""LMCache 0.5.6 ``LocalCPUBackend`` -> the host tier, as two hook tables.

One host block is one LMCache ``MemoryObj``: a *chunk* of ``chunk_size`` tokens, or
with ``use_layerwise`` one layer of a chunk (``block_tokens`` is then the engine's to
choose, :mod:`kvobs.adapters.lmcache.engine`); "chunk" below means such an object. The
engine's own account, which kvobs mirrors event by event: **cached** = chunks in the
backend's ``hot_cache``; **in use** = live allocations of its CPU buffer that are not
in the hot cache (chunks being written, duplicates the writer has not dropped yet,
chunks a reader holds after their eviction). The event table is in
:mod:`kvobs.adapters.lmcache`; prefix lookups are counted one per request at the
``LMCacheEngine`` (:mod:`kvobs.adapters.lmcache.engine`), which reads here only how
many of the chunks it found lie in this backend (``batched_contains``).

Reuse profile keys: a chunk is its ``CacheEngineKey.chunk_hash`` (LMCache's prefix-chained
hash of the chunk's tokens). The engine's lookup passes the keys this backend was asked
for (every chunk of the prompt, read in ``batched_contains``); a new chunk landing here
(``submit_put_task``) whose key no recent lookup asked for (a chunk of generated tokens,
stored by the connector's ``save_decode_cache``, or a ``store`` nobody looked up) goes to
``rec.written``, once: a duplicate put lands nothing, and a layerwise chunk, put as one
object a layer, is written by its first layer's.

Occupancy is read from the backend at collection, and the frees with it (no free is
hooked: :meth:`LMCacheInstrumentation.settle`). So ``in_use == allocations + reuses -
frees`` and ``cached == frees_to_cache + stores - reuses - evictions`` hold exactly,
duplicate puts and reads included (``kvobs.testing`` checks it).

Example:
    >>> backend = LocalCPUBackend(config, memory_allocator=allocator)   # doctest: +SKIP
    >>> inst = instrument_local_cpu_backend(backend, rec, block_tokens=256,
    ...     block_bytes=backend.get_full_chunk_size_bytes())             # doctest: +SKIP
    >>> inst.unwrap()                                                    # doctest: +SKIP
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from kvobs.adapters.api import (
    MARKER,
    AdapterError,
    AdapterSpec,
    Hook,
    Instrumentation,
    class_names,
    instrument,
)
from kvobs.errors import ConfigError
from kvobs.recorder import Recorder, TierRecorder
from kvobs.tiers import HOST

COMPONENT = "lmcache.local_cpu_backend"
ALLOCATOR_COMPONENT = "lmcache.memory_allocator"
#: Looked-up chunk keys remembered per generation (two kept): a chunk stored within this
#: many looked-up keys of its lookup is that lookup's, not written.
RECENT_KEYS = 16384


class LMCacheInstrumentation(Instrumentation):
    """Wrappers on one ``LocalCPUBackend`` (and its memory allocator).

    Attributes:
        found: chunks this backend found (``batched_contains``) during the engine
            lookup now running in thread ``probing``; the engine's lookup hook reads it.
        probing: ident of the thread whose engine lookup is probing, else None.
        keyed: feed the reuse profile (the engine sets it: a profile is kept);
            ``probe_keys`` are then the keys the running lookup asked for (a layerwise
            lookup's keys the engine makes itself: it asks per chunk).
        refusals: ``allocate`` / ``batched_allocate`` calls that returned None (no room,
            nothing evictable), in any thread.
        on_refused: called in the refused thread after a refusal is noted (the engine's
            count of the chunks its ``store`` or ``store_layer`` drops,
            :mod:`kvobs.adapters.lmcache.engine`), or None.
        cached_ids: while ``tracks_ids``, the chunks this tier counts as cached, by id
            of the memory object: their block keys (a chunk LMCache pops from its hot
            cache and frees itself, ``batched_allocate``'s evictions, is told by its id).
            Kept from the backend's first ``batched_allocate`` on (a layerwise engine's,
            from the start): LMCache 0.5.6 calls it only for a layerwise ``store_layer``,
            and a backend that never pops pays nothing for it on its puts and removals.
    """

    def __init__(self, backend: Any, rec: Recorder | None, tier: TierRecorder,
                 active: bool, block_tokens: int) -> None:
        super().__init__(backend, COMPONENT, active, rec, tier)
        self.block_tokens = block_tokens
        self.found = 0
        self.probing: int | None = None
        self.removal_reason: str | None = None   # "reset" while ``clear`` runs
        self.tracks_ids = False
        self.cached_ids: dict[int, Any] = {}
        self.keyed = False
        self.layerwise = False                    # one block a layer of a chunk (the engine)
        self.probe_keys: Sequence[Any] | None = None
        self._recent: set[int] = set()            # chunk hashes looked up lately...
        self._older: set[int] = set()             # ...and the generation before
        self.refusals = 0
        self.on_refused: Callable[[], None] | None = None
        self._settle_lock = threading.Lock()

    def refused(self) -> None:
        """An allocation returned None: note it, and tell the engine (in the refused
        thread: a ``store`` running there was cut short).

        Example:
            >>> inst = LMCacheInstrumentation(object(), None, TierRecorder("host", 4, 16, 1),
            ...                               False, 16)
            >>> inst.on_refused = lambda: print("refused")
            >>> inst.refused(); inst.refusals
            refused
            1
        """
        self.refusals += 1
        if self.on_refused is not None:
            self.on_refused()

    def looked_up(self, keys: Sequence[Any]) -> list[int]:
        """The chunk hashes of a lookup's ``keys``, remembered as looked up (so their
        landing is the lookup's own miss, not a write).

        Example:
            >>> class Key:
            ...     def __init__(self, h): self.chunk_hash = h
            >>> inst = LMCacheInstrumentation(object(), None, TierRecorder("host", 4, 16, 1),
            ...                               False, 16)
            >>> inst.looked_up([Key(7), Key(9)]), inst.was_looked_up(9), inst.was_looked_up(8)
            ([7, 9], True, False)
        """
        hashes = [key.chunk_hash for key in keys]
        recent = self._recent
        recent.update(hashes)
        if len(recent) > RECENT_KEYS:
            self._older, self._recent = recent, set()
        return hashes

    def track_ids(self) -> None:
        """Keep ``cached_ids`` from now on, starting with the chunks cached now (a put
        or removal in another thread meanwhile adds or leaves an entry of its own)."""
        self.tracks_ids = True
        ids = self.cached_ids
        for key, obj in list(self.target.hot_cache.items()):
            ids.setdefault(id(obj), block_key(self, key))

    def was_looked_up(self, chunk_hash: int) -> bool:
        """Whether a recent lookup asked for ``chunk_hash``."""
        return chunk_hash in self._recent or chunk_hash in self._older

    def settle(self) -> tuple[int, int]:
        """``(in_use, cached)`` chunks read from the backend, and the frees they imply.

        No free is hooked: LMCache's own count of its live memory objects tells them.
        A read chunk stays cached (``frees_to_cache`` = reuses), and every other way out
        of "in use" is a free (``frees_to_free`` = allocations - in use: a written chunk
        landing in the cache, a duplicate or an evicted chunk its last holder drops).
        The tier's snapshot calls it (the resident source), from any thread. The
        tallies are read before the backend, live objects before the hot cache: an event
        the reading misses leaves a derived free low (the next one adds it), never high.
        """
        with self._settle_lock:       # two sinks collecting at once must not both add
            tier = self.tier
            allocations, reuses = tier.allocations, tier.reuses
            in_use, cached = self.resident()
            if reuses > tier.frees_to_cache:
                tier.free(reuses - tier.frees_to_cache, cached=True)
            to_free = allocations - in_use
            if to_free > tier.frees_to_free:
                tier.free(to_free - tier.frees_to_free)
            return in_use, cached

    def resident(self) -> tuple[int, int]:
        """``(in_use, cached)`` chunks, read from the backend (its live memory objects
        first, then its hot cache)."""
        backend = self.target
        live = getattr(_buffer_allocator(backend), "num_active_allocations", None)
        cached = len(backend.hot_cache)
        in_use = max(int(live) - cached, 0) if isinstance(live, int) else 0
        return in_use, cached


class _AllocatorInstrumentation(Instrumentation):
    """Wrappers on the backend's memory allocator; events go to the backend's tier."""

    def __init__(self, allocator: Any, owner: LMCacheInstrumentation, active: bool) -> None:
        super().__init__(allocator, ALLOCATOR_COMPONENT, active, owner.rec, owner.tier)
        self.owner = owner


# --- readers of the backend ---------------------------------------------------------

def _allocated(inst: LMCacheInstrumentation, state: None, obj: Any, *args: Any,
               **kwargs: Any) -> None:
    if obj is not None:
        inst.tier.allocate(1)
    else:                                 # no room: the engine's store drops the rest
        inst.refused()


def _batch_allocating(inst: LMCacheInstrumentation, *args: Any, **kwargs: Any) -> None:
    if not inst.tracks_ids:               # its evictions pop chunks told by their id
        inst.track_ids()


def _batch_allocated(inst: LMCacheInstrumentation, state: None, objs: Any, *args: Any,
                     **kwargs: Any) -> None:
    if objs:
        inst.tier.allocate(len(objs))
    elif objs is None:                    # no room: the layerwise store_layer counts its drops
        inst.refused()


def block_key(inst: LMCacheInstrumentation, key: Any) -> Any:
    """A host block's key for the thrash tracker and the residency sampler: its chunk's
    hash, an int (LMCache's ``CacheEngineKey`` hashes in Python, ~0.5 us a time, and each
    event hashes its keys twice), with its layer where a block is one layer of a chunk.

    Example:
        >>> class Key:
        ...     chunk_hash, layer_id = 41, 1
        >>> inst = LMCacheInstrumentation(object(), None, TierRecorder("host", 4, 16, 1),
        ...                               False, 16)
        >>> block_key(inst, Key())
        41
        >>> inst.layerwise = True
        >>> block_key(inst, Key())
        (41, 1)
    """
    return (key.chunk_hash, key.layer_id) if inst.layerwise else key.chunk_hash


def _put(inst: LMCacheInstrumentation, state: None, result: Any, key: Any, memory_obj: Any,
         *args: Any, **kwargs: Any) -> None:
    # landed: this chunk is the key's now (a known key keeps its own chunk); the writer's
    # chunk leaving "in use" is a free the collection derives (LMCacheInstrumentation.settle)
    if inst.target.hot_cache.get(key) is memory_obj:
        block = block_key(inst, key)
        if inst.tracks_ids:
            inst.cached_ids[id(memory_obj)] = block
        inst.tier.store(1, keys=(block,))   # lands in the cache: an offload
        if inst.keyed and not (inst.layerwise and key.layer_id) and \
                not inst.was_looked_up(key.chunk_hash):   # (a layerwise chunk: its first layer)
            inst.rec.written((key.chunk_hash,))   # no lookup asked for it: written


def _found(inst: LMCacheInstrumentation, state: None, hits: int, keys: Any,
           *args: Any, **kwargs: Any) -> None:
    if inst.probing == threading.get_ident():   # inside the engine's lookup, not a
        inst.found += int(hits)                  # retrieve's block mapping elsewhere
        if inst.probe_keys is None:              # the first backend asked: every chunk
            inst.probe_keys = keys


def _got(inst: LMCacheInstrumentation, state: None, obj: Any, key: Any) -> None:
    if obj is not None:
        inst.tier.reuse(1, keys=(block_key(inst, key),))   # stays cached: settle frees it


def _batch_got(inst: LMCacheInstrumentation, state: None, objs: Any, lookup_id: str,
               keys: Any, *args: Any, **kwargs: Any) -> None:
    if objs:
        inst.tier.reuse(len(objs), keys=[block_key(inst, key) for key in keys[: len(objs)]])


def _removing(inst: LMCacheInstrumentation, key: Any, force: bool = True) -> Any:
    # the chunk, where it may outlive its removal (LMCache evicts, force=False, only
    # chunks nobody else holds) or is told by its id
    return inst.target.hot_cache.get(key) if force or inst.tracks_ids else None


def _removed(inst: LMCacheInstrumentation, obj: Any, removed: bool, key: Any,
             force: bool = True) -> None:
    if not removed:
        return
    if obj is not None and inst.tracks_ids:
        inst.cached_ids.pop(id(obj), None)
    reason = inst.removal_reason or ("explicit" if force else "capacity")
    inst.tier.evict(1, reason, keys=(block_key(inst, key),))
    if obj is not None and obj.is_valid():   # a reader still holds it: memory stays in use
        inst.tier.allocate(1)


def _clearing(inst: LMCacheInstrumentation) -> None:
    inst.removal_reason = "reset"


def _cleared(inst: LMCacheInstrumentation, state: None, result: Any) -> None:
    inst.removal_reason = None


SPEC = AdapterSpec(COMPONENT, ("LocalCPUBackend",), (
    Hook("allocate", ("shapes", "dtypes", "fmt", "eviction", "busy_loop"), "allocate",
         after=_allocated),
    Hook("batched_allocate", ("shapes", "dtypes", "batch_size"), "allocate",
         before=_batch_allocating, after=_batch_allocated),
    Hook("submit_put_task", ("key", "memory_obj"), "store", after=_put),
    Hook("batched_contains", ("keys", "pin"), "track", after=_found),
    Hook("get_blocking", ("key",), "reuse", after=_got),
    Hook("batched_get_non_blocking", ("lookup_id", "keys"), "reuse", after=_batch_got,
         reiterable=("keys",)),
    Hook("remove", ("key", "force"), "evict", before=_removing, after=_removed),
    Hook("clear", (), "track", before=_clearing, after=_cleared),
), state=("hot_cache", "memory_allocator", "cpu_lock"))


# --- readers of the memory allocator ------------------------------------------------

def _batch_freed(inst: _AllocatorInstrumentation, state: None, result: Any, memory_objs: Any,
                 *args: Any, **kwargs: Any) -> None:
    """Chunks LMCache popped from its hot cache and freed itself (``batched_allocate``'s
    evictions): capacity evictions. Every other free is derived at collection."""
    cached = inst.owner.cached_ids        # empty until the first batched_allocate
    popped = [cached.pop(id(obj)) for obj in memory_objs if id(obj) in cached]
    if popped:
        inst.tier.evict(len(popped), "capacity", keys=popped)


ALLOCATOR_SPEC = AdapterSpec(ALLOCATOR_COMPONENT, ("MemoryAllocatorInterface",), (
    Hook("batched_free", ("memory_objs",), "evict", after=_batch_freed,
         reiterable=("memory_objs",)),
))


def instrument_local_cpu_backend(backend: Any, rec: Recorder, *, block_tokens: int,
                                 block_bytes: int, capacity_blocks: int | None = None,
                                 tier: str = HOST) -> LMCacheInstrumentation:
    """Count an LMCache ``LocalCPUBackend`` (and its memory allocator) as tier ``tier``.

    Args:
        backend: the engine's ``LocalCPUBackend``.
        rec: the recorder.
        block_tokens: the model's tokens one memory object holds: LMCache's
            ``chunk_size``; layerwise, ``chunk_size / num_layers`` (0 where that is no
            whole number: the tier's token figures are then left out).
        block_bytes: bytes per full memory object: ``backend.get_full_chunk_size_bytes()``
            (a chunk, or one layer of it when layerwise), best as
            :func:`object_bytes` of it, the size the buffer gives it.
        capacity_blocks: objects the CPU buffer holds; default: the allocator's buffer
            bytes (or ``max_local_cpu_size``) divided by ``block_bytes`` rounded up to
            the allocator's alignment (4 KiB in LMCache 0.5.6).
        tier: the tier name.

    Returns:
        The instrumentation; ``unwrap()`` restores the backend and its allocator.

    Raises:
        AdapterError: not a LocalCPUBackend, or it (or its allocator) is already
            instrumented.
        ConfigError: ``block_bytes`` is not positive.

    Example:
        >>> inst = instrument_local_cpu_backend(backend, rec, block_tokens=256,
        ...                                     block_bytes=131072)   # doctest: +SKIP
        >>> rec.snapshot().tier("host").stores                        # doctest: +SKIP
        0
    """
    def make(active: bool) -> LMCacheInstrumentation:
        capacity = capacity_blocks if capacity_blocks is not None else \
            _capacity(backend, block_bytes)
        add = rec.add_tier if active else TierRecorder  # an unknown backend exports nothing
        return LMCacheInstrumentation(backend, rec, add(tier, capacity, block_tokens,
                                                        block_bytes), active, block_tokens)

    inst = instrument(backend, SPEC, make)
    if not inst.active:
        return inst
    allocator = backend.memory_allocator
    if not class_names(allocator) & set(ALLOCATOR_SPEC.kinds) or \
            getattr(allocator, MARKER, None) is not None:
        inst.unwrap()
        raise AdapterError(f"{COMPONENT}: its memory allocator {type(allocator).__name__} is "
                           "not a MemoryAllocatorInterface or is already instrumented")
    allocator_inst = instrument(allocator, ALLOCATOR_SPEC,
                                lambda active: _AllocatorInstrumentation(allocator, inst, active))
    if not allocator_inst.active:          # never half: without its frees the flows drift
        inst.unwrap()                      # (instrument() logged what differs)
        return inst
    inst.on_unwrap(allocator_inst.unwrap)
    inst.tier.set_resident_source(inst.settle)
    inst.on_unwrap(lambda: inst.tier.set_resident_source(None))
    return inst


def _capacity(backend: Any, block_bytes: int) -> int:
    if isinstance(block_bytes, bool) or not isinstance(block_bytes, int) or block_bytes <= 0:
        raise ConfigError(f"lmcache: block_bytes must be a positive integer, got "
                          f"{block_bytes!r}: pass backend.get_full_chunk_size_bytes()")
    allocator = _buffer_allocator(backend)
    buffer = getattr(allocator, "buffer", None)
    total = buffer.numel() * buffer.element_size() if buffer is not None else \
        int(float(getattr(backend.config, "max_local_cpu_size", 0)) * 1024**3)
    return int(total // max(object_bytes(backend, block_bytes), 1))   # aligned sizes


def object_bytes(backend: Any, nbytes: int) -> int:
    """The bytes a memory object of ``nbytes`` takes in the backend's CPU buffer:
    ``nbytes`` rounded up to the allocator's alignment (4 KiB in LMCache 0.5.6), which
    is also what LMCache's ``local_cache_usage`` counts; ``nbytes`` where the allocator
    does not say.

    Example:
        >>> class Manager:
        ...     def compute_aligned_size(self, n): return -(-n // 4096) * 4096
        >>> class Allocator: address_manager = Manager()
        >>> class Backend: memory_allocator = Allocator()
        >>> object_bytes(Backend(), 2048), object_bytes(Backend(), 8192)
        (4096, 8192)
    """
    allocator = _buffer_allocator(backend)
    aligned = getattr(getattr(allocator, "address_manager", None), "compute_aligned_size", None)
    return int(aligned(nbytes)) if callable(aligned) else nbytes


def _buffer_allocator(backend: Any) -> Any:
    """The allocator owning the CPU buffer (``MixedMemoryAllocator`` keeps it in
    ``pin_allocator``)."""
    allocator = backend.memory_allocator
    return getattr(allocator, "pin_allocator", allocator)
