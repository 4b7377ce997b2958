"""SGLang 0.5.23 GPU tier: the token/page allocator and the radix cache over it.

A kvobs block is one SGLang *page* (``page_size`` tokens; 1 for the token allocator).
The engine's own account, which kvobs mirrors: **resident** pages = ``size -
available_size()``; **cached** = the radix cache's ``evictable_size()`` (in the tree, no
request holds them); **in use** = resident - cached (running requests' pages, locked
tree pages included: ``protected_size()``).

Events are read as *changes* of those engine numbers after each hooked call (a
"settle"), so nested engine calls, deferred frees (``free_group_begin``/``end``) and
every allocation path count once and exactly:

=========================================  ===========================================
engine change                              events
=========================================  ===========================================
``available_size()`` falls by n pages      ``allocate(n)``
``available_size()`` rises by n pages      ``free(n)`` (in use -> free), except inside
                                           an eviction (counted as the eviction)
``evictable_size()`` rises by n pages      ``free(n, cached=True)``: a request's pages
                                           inserted or unlocked, kept for reuse
``evictable_size()`` falls by n pages      ``reuse(n)``: a prefix hit locks cached pages
``evict`` or ``evict_for_alloc`` (the      ``evict(n, "capacity")``, n = the call's
allocator's ``evict_to_free_tokens``)      ``num_tokens_evicted`` (outermost call only)
``reset``                                  ``evict(cached, "reset")``; the allocator's
                                           ``clear`` then frees the rest
``finish_storage_prefetch_admission``      ``rec.lookup(tokens, gpu_hit, host_hit,
(``PrefillAdder`` admits a request)        keys)``: one per request admitted, from its
                                           last ``match_prefix`` (``params.req`` set)
                                           and its ``init_load_back``; ``keys``: the
                                           matched key's full pages (:func:`page_keys`)
``checkpoint`` advances                    ``rec.written(keys)``: the pages the tree now
``req.kv.cache_protected_len``             holds beyond the ones the request's lookup
                                           referenced (its answer, written in decode;
                                           a finished or a running request), each once
``_execute_kv_backup`` -> None (host       ``rec.link(gpu, host).drop(n)``: n device
eviction cannot make room), or the         pages refused a backup, each once until it
controller's ``write`` -> None             is freed or backed up
``evict_host``                             the host pages it frees are host
                                           ``evict(n, "capacity")`` (:mod:`.host`)
``writing_check`` / ``loading_check``      ``link.timed(s)``: the device time of each
                                           copy it reaped, for the copies SGLang times
                                           (``HiCacheAck.timing_enabled``; not on CPU)
=========================================  ===========================================

Lookups: the scheduler re-runs ``match_prefix`` for a waiting request every round
(``Req.init_next_round_input``), so a match is only remembered (per request handle,
the last one wins, at most :data:`PENDING_LIMIT` waiting requests); the admission
counts it once, with ``device_prefix_len`` as GPU hit and the host tokens
``init_load_back`` really loaded (none when the load was refused) as host hit -- the
split SGLang's ``PrefillAdder`` reports as ``cached_tokens`` from device and host.
A retracted request readmitted counts again (SGLang leaves it out of its split).

Reuse profile keys: one per page, chained over the page's tokens and every page before
it (and the key's ``extra_key`` / ``cache_salt`` namespace), so a page's key names its
whole prefix as the radix tree does. The lookup passes the pages the match could hit
(``len(key)`` full pages: SGLang matches at most the prompt less its last token); the
chain is kept per running request and extended, never recomputed, when ``checkpoint``
inserts more pages (SGLang 0.5.23 has no ``cache_finished_req`` /
``cache_unfinished_req``: ``release_kv_cache`` and ``checkpoint_kv_cache`` both call
``checkpoint``). Pages past the lookup's go to ``rec.written`` once: the insert moves
``cache_protected_len`` forward only. Off when the recorder keeps no profile.

Drops: with a full host, 0.5.23's tree refuses a backup itself (its private
``_execute_kv_backup`` returns None when host eviction cannot make room; the only place
the refusal is visible, hooked if present) and retries the node on later hits. kvobs
counts a refused device page once until it is freed or backed up; SGLang counts the
same pages in ``sglang:hicache_dropped_tokens_total`` when it destroys them unbacked
(write-back: at once; write-through: when they are evicted).

Occupancy is read from the engine at collection, after a last settle, so the flows
identity holds exactly at every snapshot (``kvobs.testing`` checks it). Between a
tree's ``reset`` and the allocator's ``clear`` (one ``flush_cache``) the flows lag the
engine by the reset pages.

Example:
    >>> inst = instrument_token_allocator(allocator, rec, tree_cache=tree)  # doctest: +SKIP
    >>> rec.snapshot().tier("gpu").cached_blocks                            # doctest: +SKIP
    0
"""

from __future__ import annotations

from array import array
from collections.abc import Hashable
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
from kvobs.recorder import Recorder, TierRecorder
from kvobs.tiers import GPU, HOST

ALLOCATOR_COMPONENT = "sglang.token_allocator"
TREE_COMPONENT = "sglang.radix_cache"
#: Waiting requests whose last match is remembered until admission (oldest dropped).
PENDING_LIMIT = 4096


class GpuInstrumentation(Instrumentation):
    """Wrappers on one SGLang token allocator (and its radix cache); counts in pages."""

    def __init__(self, allocator: Any, rec: Recorder | None, tier: TierRecorder,
                 active: bool) -> None:
        super().__init__(allocator, ALLOCATOR_COMPONENT, active, rec, tier)
        self.page = int(getattr(allocator, "page_size", 1) or 1)
        self.free_pages = 0 if not active else int(allocator.available_size()) // self.page
        self.tree_cache: Any = None
        self.cached_pages = 0      # evictable pages last seen in the tree
        self.evicting = 0          # eviction calls in progress: freed pages are evictions
        self.orphaned = 0          # pages a tree reset evicted, not yet back in the free list
        #: device pages whose host backup was refused (the controller's drops); a page
        #: leaves the set when it is freed or backed up, so a block drops once.
        self.refused: set[int] = set()

    def settle_pool(self) -> None:
        """Count what changed in the allocator since the last settle."""
        now = int(self.target.available_size()) // self.page
        taken, self.free_pages = self.free_pages - now, now
        if taken > 0:
            self.tier.allocate(taken)
        elif taken < 0 and not self.evicting:
            freed = -taken
            absorbed = min(freed, self.orphaned)
            self.orphaned -= absorbed
            if freed > absorbed:
                self.tier.free(freed - absorbed)

    def settle(self) -> None:
        """Count what changed in the allocator and the tree since the last settle."""
        self.settle_pool()
        tree = self.tree_cache
        if tree is not None:
            cached = int(tree.evictable_size()) // self.page
            grown, self.cached_pages = cached - self.cached_pages, cached
            if grown > 0:
                self.tier.free(grown, cached=True)
            elif grown < 0:
                self.tier.reuse(-grown)

    def resident(self) -> tuple[int, int]:
        """``(in_use, cached)`` pages read from the engine (after a last settle)."""
        self.settle()
        allocator = self.target
        resident = (int(allocator.size) - int(allocator.available_size())) // self.page
        cached = 0
        if self.tree_cache is not None:
            cached = min(int(self.tree_cache.evictable_size()) // self.page, resident)
        return resident - cached, cached


class TreeInstrumentation(Instrumentation):
    """Wrappers on one prefix cache; its events go to the allocator's tier."""

    def __init__(self, tree: Any, gpu: GpuInstrumentation, active: bool) -> None:
        super().__init__(tree, TREE_COMPONENT, active, gpu.rec, gpu.tier)
        self.gpu = gpu
        #: request handle -> [tokens, gpu hit, host hit promised, host loaded, key]
        self.pending: dict[Any, list[Any]] = {}
        #: keep page keys for the reuse profile (the recorder keeps one)
        self.keyed = bool(getattr(gpu.rec, "profile_reuse", False))
        #: running request handle -> its page keys so far and how many its lookup had
        self.chains: dict[Any, Chain] = {}


class Chain:
    """One running request's page keys (:func:`page_keys`) and the pages its lookup
    referenced: pages past those that the tree takes are written."""

    __slots__ = ("keys", "looked", "seed")

    def __init__(self, seed: int, keys: list[Hashable]) -> None:
        self.seed = seed
        self.keys = keys
        self.looked = len(keys)


def key_seed(key: Any) -> int:
    """The namespace a radix key's pages hash under (``extra_key``, ``cache_salt``).

    Example:
        >>> key_seed([1, 2, 3])
        0
    """
    extra, salt = getattr(key, "extra_key", None), getattr(key, "cache_salt", None)
    return 0 if extra is None and salt is None else hash((extra, salt))


def page_keys(keys: list[Hashable], token_ids: Any, page: int, pages: int,
              seed: int = 0) -> list[Hashable]:
    """Extend ``keys`` (the chain of pages ``0..len(keys)-1``) to ``pages`` pages of
    ``token_ids`` and return it: page ``i``'s key hashes the key of page ``i - 1`` (or
    ``seed``) with its ``page`` tokens, so it names the whole prefix. One slice and one
    hash per page (``array('q')`` pages hash as bytes; no per-token Python work).

    Example:
        >>> a = page_keys([], [1, 2, 3, 4, 5], page=2, pages=2)
        >>> b = page_keys([], [1, 2, 3, 4, 9], page=2, pages=2)
        >>> len(a), a == b, page_keys([], [9, 2, 3, 4], 2, 2)[1] == a[1]
        (2, True, False)
    """
    prev = keys[-1] if keys else seed
    packed = isinstance(token_ids, array)
    for start in range(len(keys) * page, pages * page, page):
        part = token_ids[start:start + page]
        prev = hash((prev, part.tobytes() if packed else tuple(part)))
        keys.append(prev)
    return keys


def _settle(inst: GpuInstrumentation, state: None, result: Any, *args: Any,
            **kwargs: Any) -> None:
    inst.settle_pool()     # tree changes settle in the tree's hooks and at collection


def _freed(inst: GpuInstrumentation, state: None, result: Any, free_index: Any,
           *args: Any, **kwargs: Any) -> None:
    inst.settle_pool()
    if inst.refused and free_index is not None and len(free_index):
        inst.refused.difference_update((free_index // inst.page).tolist())


def _freed_pages(inst: GpuInstrumentation, state: None, result: Any, page_ids: Any,
                 *args: Any, **kwargs: Any) -> None:
    inst.settle_pool()
    if inst.refused and page_ids is not None and len(page_ids):
        inst.refused.difference_update(page_ids.tolist())


def _settle_tree(inst: TreeInstrumentation, state: None, result: Any, *args: Any,
                 **kwargs: Any) -> None:
    inst.gpu.settle()


def _handle(req: Any) -> Any:
    return getattr(req, "cache_request_handle", None) or id(req)


def _matched(inst: TreeInstrumentation, state: None, result: Any, params: Any,
             *args: Any, **kwargs: Any) -> None:
    inst.gpu.settle()
    req = getattr(params, "req", None)
    if req is None:                 # the tree's own walks (touch, probes): no request
        return
    key = params.key
    tokens = len(getattr(key, "token_ids", key))
    host = int(getattr(result, "host_hit_length", 0) or 0)
    handle = _handle(req)
    pending = inst.pending
    pending.pop(handle, None)       # a re-match of a waiting request replaces its last
    pending[handle] = [tokens, int(result.device_prefix_len), host, 0, key]
    if len(pending) > PENDING_LIMIT:
        del pending[next(iter(pending))]


def _loaded_back(inst: TreeInstrumentation, state: None, result: Any, params: Any,
                 *args: Any, **kwargs: Any) -> None:
    inst.gpu.settle()
    req = getattr(params, "req", None)
    if result is not None and req is not None:
        match = inst.pending.get(_handle(req))
        if match is not None:
            match[3] = int(result[0])


def _admitted(inst: TreeInstrumentation, state: None, result: Any, handle: Any,
              *args: Any, **kwargs: Any) -> None:
    match = inst.pending.pop(handle, None)
    if match is not None:
        tokens, gpu_hit, promised, loaded, key = match
        keys = _lookup_keys(inst, handle, key) if inst.keyed else None
        inst.rec.lookup(tokens, gpu_hit=gpu_hit, host_hit=min(promised, loaded), keys=keys)


def _lookup_keys(inst: TreeInstrumentation, handle: Any, key: Any) -> list[Hashable]:
    """The admitted request's page keys: the full pages its match could hit, kept as
    the start of its chain (a re-admission starts a new one)."""
    seed = key_seed(key)
    keys = page_keys([], getattr(key, "token_ids", key), inst.gpu.page,
                     len(key) // inst.gpu.page, seed)
    chains = inst.chains
    chains.pop(handle, None)
    chains[handle] = Chain(seed, keys)
    if len(chains) > PENDING_LIMIT:
        del chains[next(iter(chains))]
    return keys


def _checkpointing(inst: TreeInstrumentation, req: Any, *args: Any, **kwargs: Any) -> int:
    return int(req.kv.cache_protected_len)


def _checkpointed(inst: TreeInstrumentation, protected: int, result: Any, req: Any,
                  *args: Any, **kwargs: Any) -> None:
    """Pages the tree took beyond the lookup's, as the request's own page keys:
    written (``cache_protected_len`` only moves forward, so each page once)."""
    inst.gpu.settle()
    if not inst.keyed:
        return
    chain = inst.chains.get(_handle(req))
    if chain is None:               # admitted before kvobs, or beyond PENDING_LIMIT
        return
    page = inst.gpu.page
    end = int(req.kv.cache_protected_len) // page
    start = max(protected // page, chain.looked)
    if start < end:
        keys = page_keys(chain.keys, req.full_untruncated_fill_ids, page, end, chain.seed)
        inst.rec.written(keys[start:end])


def _released(inst: TreeInstrumentation, state: None, result: Any, req: Any,
              *args: Any, **kwargs: Any) -> None:
    inst.gpu.settle()
    inst.chains.pop(_handle(req), None)


def _evicting(inst: TreeInstrumentation, *args: Any, **kwargs: Any) -> None:
    gpu = inst.gpu
    if not gpu.evicting:
        gpu.settle()
    gpu.evicting += 1


def _evicted(inst: TreeInstrumentation, state: None, result: Any, *args: Any,
             **kwargs: Any) -> None:
    gpu = inst.gpu
    gpu.evicting -= 1
    if gpu.evicting:               # evict_for_alloc -> evict: the outer call counts
        return
    gpu.settle_pool()            # the freed pages: absorbed, they are the eviction
    pages = int(result.num_tokens_evicted) // gpu.page
    if pages:
        gpu.tier.evict(pages, "capacity")
        gpu.cached_pages -= pages
    gpu.settle()


def _resetting(inst: TreeInstrumentation, *args: Any, **kwargs: Any) -> None:
    inst.gpu.settle()


def _was_reset(inst: TreeInstrumentation, state: None, result: Any) -> None:
    gpu = inst.gpu
    if gpu.cached_pages:
        gpu.tier.evict(gpu.cached_pages, "reset")
        gpu.orphaned += gpu.cached_pages   # still allocated until the allocator's clear
        gpu.cached_pages = 0
    inst.pending.clear()
    inst.chains.clear()
    gpu.settle()


def refuse_backup(rec: Recorder, refused: set[int], pages: list[int], src: str,
                  dst: str) -> None:
    """Count the device ``pages`` whose host backup was refused as drops, each once until
    it is freed or backed up (a node SGLang retries on every hit drops once)."""
    new = [p for p in pages if p not in refused]
    if new:
        refused.update(new)
        rec.link(src, dst).drop(len(new))


def _host_pool(inst: TreeInstrumentation) -> Any:
    """The host pool instrumentation of the tree's HiCache controller (None: none)."""
    controller = getattr(getattr(inst.target, "cache_controller", None), MARKER, None)
    return getattr(controller, "host", None)


def _backed_up(inst: TreeInstrumentation, state: None, result: Any, node_id: Any,
               device_value: Any, *args: Any, **kwargs: Any) -> None:
    gpu = inst.gpu
    page = gpu.page
    pages = (device_value[::page] // page).tolist() if len(device_value) else []
    if result is not None:
        gpu.refused.difference_update(pages)
        return
    host = _host_pool(inst)
    refuse_backup(inst.rec, gpu.refused, pages, gpu.tier.name,
                  host.tier.name if host is not None else HOST)


def _host_evicting(inst: TreeInstrumentation, *args: Any, **kwargs: Any) -> Any:
    host = _host_pool(inst)
    if host is not None:
        host.evicting += 1
    return host


def _host_evicted(inst: TreeInstrumentation, host: Any, result: Any, *args: Any,
                  **kwargs: Any) -> None:
    if host is not None:
        host.evicting -= 1


def _timed(offload: bool, queue_name: str) -> Any:
    def reaped(inst: TreeInstrumentation, state: None, result: Any, *args: Any,
               **kwargs: Any) -> None:
        inst.gpu.settle()
        controller = getattr(inst.target, "cache_controller", None)
        host: Any = getattr(controller, MARKER, None)
        timed = getattr(host, "timed", None)
        pending = timed[offload] if timed else None
        if not pending:             # CPU: torch.cpu.Event cannot time; SGLang has none
            return
        left = {id(ack) for ack in getattr(controller, queue_name, ())}
        done = [ack for ack in pending if id(ack) not in left]
        if not done:
            return
        pending[:] = [ack for ack in pending if id(ack) in left]
        gpu, host_tier = inst.gpu.tier.name, host.host.tier.name
        link = inst.rec.link(gpu, host_tier) if offload else inst.rec.link(host_tier, gpu)
        for ack in done:
            link.timed(ack.start_event.elapsed_time(ack.finish_event) / 1000.0)
    return reaped


_ALLOCATOR_PATHS = ("alloc_extend", "alloc_decode", "free_group_end", "clear")
ALLOCATOR_SPEC = AdapterSpec(ALLOCATOR_COMPONENT, ("BaseTokenToKVPoolAllocator",), (
    Hook("alloc", ("need_size",), "allocate", after=_settle),
    Hook("free", ("free_index",), "free", after=_freed),
    Hook("free_full", ("free_index",), "free", after=_freed, optional=True),
    Hook("free_segment", ("free_index",), "free", after=_freed, optional=True),
    Hook("free_page_ids", ("page_ids",), "free", after=_freed_pages, optional=True),
    *(Hook(name, (), "allocate, free", after=_settle, optional=True)
      for name in _ALLOCATOR_PATHS),
), state=("size", "page_size", "available_size"))

_TREE_MUTATORS = ("insert", "inc_lock_ref", "dec_lock_ref", "lock", "unlock", "free_kv_row",
                  "cache_finished_req", "cache_unfinished_req")
TREE_SPEC = AdapterSpec(TREE_COMPONENT, ("BasePrefixCache",), (
    Hook("match_prefix", ("params",), "lookup", after=_matched),
    Hook("finish_storage_prefetch_admission", (), "lookup", after=_admitted),
    Hook("init_load_back", ("params",), "lookup", after=_loaded_back, optional=True),
    Hook("evict", ("params",), "evict", before=_evicting, after=_evicted),
    Hook("evict_for_alloc", ("params",), "evict", before=_evicting, after=_evicted,
         optional=True),
    Hook("reset", (), "evict", before=_resetting, after=_was_reset),
    # pages inserted past the lookup's (an answer): written, for the reuse profile
    Hook("checkpoint", ("req",), "free, reuse", before=_checkpointing, after=_checkpointed,
         optional=True),
    Hook("on_release", ("req",), "free, reuse", after=_released, optional=True),
    # host pages the tree frees to make room are capacity evictions of the host tier
    Hook("evict_host", ("num_tokens",), "evict", before=_host_evicting, after=_host_evicted,
         optional=True),
    # 0.5.23: the tree refuses a backup itself when host eviction cannot make room
    Hook("_execute_kv_backup", ("node_id", "device_value"), "drop", after=_backed_up,
         optional=True),
    Hook("writing_check", (), "track", after=_timed(True, "ack_write_queue"),
         optional=True),
    Hook("loading_check", (), "track", after=_timed(False, "ack_load_queue"),
         optional=True),
    *(Hook(name, (), "free, reuse", after=_settle_tree, optional=True)
      for name in _TREE_MUTATORS),
), state=("evictable_size", "protected_size"))


def kv_page_bytes(allocator: Any) -> int:
    """Bytes of one page across layers, as SGLang sized the allocator's KV pool: its K and
    V buffers (``get_kv_size_bytes()``, what it logs as ``K size`` / ``V size`` and exports
    as ``sglang:kv_cache_memory_usage_gb``) over their ``size + page_size`` token slots
    (one padding page); 0 when the pool does not say or its buffers hold another layout.

    Example:
        >>> kv_page_bytes(object())
        0
    """
    try:
        pool = allocator.get_kvcache()
        sizes = pool.get_kv_size_bytes()
        total = int(sum(sizes)) if isinstance(sizes, tuple) else int(sizes)
        page = int(pool.page_size)
        slots = int(pool.size) + page
    except (AttributeError, AssertionError, TypeError, ValueError):
        return 0
    if total <= 0 or slots <= 0 or total % slots:
        return 0
    return total // slots * page


def instrument_token_allocator(allocator: Any, rec: Recorder, *, tier: str = GPU,
                               tree_cache: Any = None,
                               block_bytes: int | None = None) -> GpuInstrumentation:
    """Count an SGLang token/page allocator (and its radix cache) as tier ``tier``.

    Args:
        allocator: the scheduler's ``token_to_kv_pool_allocator``.
        rec: the recorder.
        tree_cache: the scheduler's ``tree_cache`` (``UnifiedRadixCache``; the older
            ``RadixCache`` too); with it kvobs tells cached pages from pages in use,
            counts prefix hits (reuses), evictions and one lookup per admitted request.
            Without it every resident page reads as in use.
        block_bytes: bytes per page across layers; default: as SGLang sized the
            allocator's KV pool (:func:`kv_page_bytes`; 0: unknown).

    Returns:
        The instrumentation; ``unwrap()`` restores the allocator and the tree.

    Raises:
        AdapterError: not a token allocator (or ``tree_cache`` not a prefix cache), or
            already instrumented.

    Example:
        >>> inst = instrument_token_allocator(allocator, rec, tree_cache=tree)  # doctest: +SKIP
        >>> inst.unwrap()                                                       # doctest: +SKIP
    """
    def make(active: bool) -> GpuInstrumentation:
        page = int(getattr(allocator, "page_size", 1) or 1)
        pages = int(getattr(allocator, "size", 0)) // page
        size = kv_page_bytes(allocator) if block_bytes is None else block_bytes
        add = rec.add_tier if active else TierRecorder   # an unknown version exports nothing
        return GpuInstrumentation(allocator, rec, add(tier, pages, page, size), active)

    if tree_cache is not None and (not class_names(tree_cache) & set(TREE_SPEC.kinds) or
                                   getattr(tree_cache, MARKER, None) is not None):
        raise AdapterError(f"{TREE_COMPONENT}: tree_cache must be the scheduler's own "
                           f"BasePrefixCache, not yet instrumented; got "
                           f"{type(tree_cache).__qualname__}")
    inst = instrument(allocator, ALLOCATOR_SPEC, make)
    if not inst.active:
        return inst
    if tree_cache is not None:
        tree = instrument(tree_cache, TREE_SPEC,
                          lambda active: TreeInstrumentation(tree_cache, inst, active))
        if tree.active:
            inst.tree_cache = tree_cache
            inst.cached_pages = int(tree_cache.evictable_size()) // inst.page
            inst.on_unwrap(tree.unwrap)
    inst.tier.set_resident_source(inst.resident)
    inst.on_unwrap(lambda: inst.tier.set_resident_source(None))
    return inst
