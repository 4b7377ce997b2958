"""SGLang 0.5.23 HiCache: the host pool and the cache controller that fills it.

With ``--enable-hierarchical-cache`` SGLang 0.5.23's ``UnifiedRadixCache.init_hicache``
attaches a ``HybridCacheController`` (a ``HiCacheController``) whose ``mem_pool_host``
is a ``HostPoolGroup``: an anchor KV pool (``MHATokenToKVPoolHost``...) plus side pools
(SWA, Mamba, indexer) on hybrid models. A bare ``HiCacheController`` over one
``HostKVCache`` is accepted too.

A host block is one host *page* of the anchor pool (``page_size`` tokens); the host
tier's page bytes are the page's tokens times one token's bytes summed over every pool
of the group. Every reserved host page holds backed-up KV, so the host tier's pages are
all cached (none in use). Keys for the thrash tracker are host page ids.

=======================================  =============================================
engine call                              events
=======================================  =============================================
anchor pool ``alloc`` (not None)         ``store(pages, keys)``: a backup's host pages
anchor pool ``free``                     ``evict(pages, "capacity", keys)`` inside the
                                         tree's ``evict_host`` (room for backups),
                                         else ``evict(pages, "other", keys)``
anchor pool ``clear``                    ``evict(cached, "reset")``
controller ``start_writing`` (an ack     ``rec.link(gpu, host).transfer(pages, bytes)``
queued)                                  for the merged copy: pages = its tokens /
                                         page, bytes = its tokens per pool
                                         (``num_tokens_by_pool``) times that pool's
                                         bytes per token, summed
controller ``start_loading`` (an ack     ``rec.link(host, gpu).transfer(pages, bytes)``
queued)                                  likewise
controller ``load`` (not None)           host ``reuse(pages, keys)`` + ``free(pages,
                                         cached=True)``: a host hit read back; the host
                                         copy stays cached
controller ``write`` -> None             ``rec.link(gpu, host).drop(n)``: n device pages
                                         whose backup the full host refused, each once
                                         until it is freed or backed up (the tree's own
                                         refusals: :mod:`.gpu`)
=======================================  =============================================

Transfers count when the controller queues the merged copy (``HiCacheAck``) on its
transfer stream; SGLang's own counters (``sglang:hicache_backup_*``,
``sglang:load_back_*``) count the same ack when ``writing_check`` / ``loading_check``
reaps it, so the two agree whenever no copy is in flight. Durations are SGLang's device
times only: a queued ack with ``timing_enabled`` is kept (at most
:data:`TIMED_LIMIT`) until the tree's ``writing_check`` / ``loading_check`` reaps it,
then its event pair's ``elapsed_time`` is the duration (:mod:`.gpu`). On CPU torch has
no timing events: no durations, and SGLang has none either. A sidecar transfer riding
another pool's indices (excluded from ``num_tokens_by_pool``) is not in the bytes.

Example:
    >>> inst = instrument_cache_controller(tree.cache_controller, rec)  # doctest: +SKIP
    >>> rec.snapshot().link("gpu", "host").blocks                       # doctest: +SKIP
    0
"""

from __future__ import annotations

from typing import Any

from kvobs.adapters.api import (
    MARKER,
    AdapterError,
    AdapterSpec,
    Hook,
    Instrumentation,
    class_names,
    instrument,
    warn_once,
)
from kvobs.adapters.sglang.gpu import refuse_backup
from kvobs.recorder import Recorder, TierRecorder
from kvobs.tiers import GPU, HOST

HOST_COMPONENT = "sglang.host_pool"
CONTROLLER_COMPONENT = "sglang.cache_controller"
HOST_KINDS = ("HostKVCache",)
#: Timed copies remembered until reaped (a tree not instrumented never reaps them).
TIMED_LIMIT = 1024


class HostInstrumentation(Instrumentation):
    """Wrappers on one SGLang host pool; ``tier`` counts in host pages."""

    def __init__(self, pool: Any, rec: Recorder | None, tier: TierRecorder, active: bool,
                 gpu_tier: str) -> None:
        super().__init__(pool, HOST_COMPONENT, active, rec, tier)
        self.page = int(getattr(pool, "page_size", 1) or 1)
        self.gpu_tier = gpu_tier
        self.evicting = 0          # inside the tree's evict_host: frees are capacity evictions

    def pages(self, indices: Any) -> list[int]:
        """Host page ids of token ``indices`` (pages are reserved whole)."""
        return (indices[:: self.page] // self.page).tolist()  # type: ignore[no-any-return]

    def resident(self) -> tuple[int, int]:
        """``(in_use, cached)`` pages of the pool: every reserved page holds KV."""
        pool = self.target
        return 0, (int(pool.size) - int(pool.available_size())) // self.page


def _reserved(inst: HostInstrumentation, state: None, indices: Any, need_size: int,
              *args: Any, **kwargs: Any) -> None:
    if indices is not None:
        inst.tier.store(need_size // inst.page, keys=inst.pages(indices))


def _released(inst: HostInstrumentation, state: None, freed: Any, indices: Any) -> None:
    if freed:
        keys = sorted(set((indices.cpu() // inst.page).tolist()))
        inst.tier.evict(len(keys), "capacity" if inst.evicting else "other", keys=keys)


def _clearing(inst: HostInstrumentation) -> int:
    return inst.resident()[1]


def _cleared(inst: HostInstrumentation, cached: int, result: Any) -> None:
    if cached:
        inst.tier.evict(cached, "reset")


HOST_SPEC = AdapterSpec(HOST_COMPONENT, HOST_KINDS, (
    Hook("alloc", ("need_size",), "store", after=_reserved),
    Hook("free", ("indices",), "evict", after=_released),
    Hook("clear", (), "evict", before=_clearing, after=_cleared),
), state=("size", "page_size", "size_per_token", "available_size"))


class ControllerInstrumentation(Instrumentation):
    """Wrappers on one ``HiCacheController``; transfers go to ``rec``'s links."""

    def __init__(self, controller: Any, host: HostInstrumentation, pool_bytes: dict[str, int],
                 active: bool) -> None:
        super().__init__(controller, CONTROLLER_COMPONENT, active, host.rec, host.tier)
        self.host = host
        self.pool_bytes = pool_bytes       # one token's bytes per member pool
        self.anchor_bytes = next(iter(pool_bytes.values()), 0)
        #: queued copies SGLang times on the device, until the tree reaps them
        #: ({offload: [HiCacheAck]}, read by the tree's writing_check / loading_check)
        self.timed: dict[bool, list[Any]] = {True: [], False: []}
        gpu = getattr(getattr(controller, "mem_pool_device_allocator", None), MARKER, None)
        #: device pages refused a backup, shared with the allocator's instrumentation
        #: (which forgets a page when it is freed)
        self.refused: set[int] = gpu.refused if gpu is not None else set()


def _queued(queue_name: str, offload: bool) -> Any:
    def before(inst: ControllerInstrumentation, *args: Any, **kwargs: Any) -> int:
        return len(getattr(inst.target, queue_name))

    def after(inst: ControllerInstrumentation, queued: int, result: Any, *args: Any,
              **kwargs: Any) -> None:
        acks = getattr(inst.target, queue_name)[queued:]
        if not acks:
            return
        host = inst.host
        link = inst.rec.link(host.gpu_tier, host.tier.name) if offload else \
            inst.rec.link(host.tier.name, host.gpu_tier)
        sizes, timed = inst.pool_bytes, inst.timed[offload]
        for ack in acks:
            if getattr(ack, "timing_enabled", False) and len(timed) < TIMED_LIMIT:
                timed.append(ack)
            tokens = int(ack.num_tokens)
            by_pool = getattr(ack, "num_tokens_by_pool", None)
            nbytes = sum(n * sizes.get(name, 0) for name, n in by_pool.items()) if by_pool \
                else tokens * inst.anchor_bytes
            link.transfer(tokens // host.page, nbytes)
    return before, after


def _written(inst: ControllerInstrumentation, state: None, host_indices: Any,
             device_indices: Any, *args: Any, **kwargs: Any) -> None:
    page = inst.host.page
    pages = (device_indices[::page] // page).tolist() if len(device_indices) else []
    if host_indices is not None:
        if inst.refused:
            inst.refused.difference_update(pages)
        return
    host = inst.host
    refuse_backup(inst.rec, inst.refused, pages, host.gpu_tier, host.tier.name)


def _loaded(inst: ControllerInstrumentation, state: None, device_indices: Any,
            host_indices: Any, *args: Any, **kwargs: Any) -> None:
    if device_indices is not None and len(host_indices):
        host = inst.host
        pages = len(host_indices) // host.page
        host.tier.reuse(pages, keys=host.pages(host_indices))
        host.tier.free(pages, cached=True)


_WRITES, _LOADS = _queued("ack_write_queue", True), _queued("ack_load_queue", False)
CONTROLLER_SPEC = AdapterSpec(CONTROLLER_COMPONENT, ("HiCacheController",), (
    Hook("write", ("device_indices",), "drop", after=_written),
    Hook("load", ("host_indices",), "reuse, free", after=_loaded),
    Hook("start_writing", (), "transfer", before=_WRITES[0], after=_WRITES[1]),
    Hook("start_loading", (), "transfer", before=_LOADS[0], after=_LOADS[1]),
), state=("mem_pool_host", "ack_write_queue", "ack_load_queue", "page_size"))


def host_pools(pool: Any) -> tuple[Any, list[tuple[str, Any]]]:
    """The anchor host pool of ``pool`` (a ``HostPoolGroup`` or a bare host pool) and
    every member as ``(name, pool)``, anchor first."""
    entries = getattr(pool, "entries", None)
    anchor_entry = getattr(pool, "anchor_entry", None)
    if entries is None or anchor_entry is None:
        return pool, [("kv", pool)]
    members = [(str(getattr(anchor_entry.name, "value", anchor_entry.name)),
                anchor_entry.host_pool)]
    members += [(str(getattr(e.name, "value", e.name)), e.host_pool) for e in entries
                if e is not anchor_entry]
    return anchor_entry.host_pool, members


def pool_token_bytes(pool: Any) -> dict[str, int]:
    """Bytes of one token per member pool (``{"kv": ...}`` for a bare host pool). A
    member kvobs cannot size (not a ``HostKVCache``, or without an integer
    ``size_per_token``) is left out, with one warning naming it."""
    sizes: dict[str, int] = {}
    for name, member in host_pools(pool)[1]:
        size = getattr(member, "size_per_token", None)
        if not class_names(member) & set(HOST_KINDS) or not isinstance(size, int):
            warn_once(f"{CONTROLLER_COMPONENT}:member:{name}:{type(member).__qualname__}",
                      "kvobs_sglang_unknown_host_pool", component=CONTROLLER_COMPONENT,
                      pool=name, cls=type(member).__qualname__,
                      action="its bytes are left out of the transfer and host-page bytes")
            continue
        sizes[name] = size
    return sizes


def instrument_host_pool(host_pool: Any, rec: Recorder, *, tier: str = HOST,
                         gpu_tier: str = GPU, page_bytes: int | None = None
                         ) -> HostInstrumentation:
    """Count an SGLang HiCache host pool (``HostKVCache``) as tier ``tier`` of ``rec``.

    Args:
        host_pool: a host pool (``MHATokenToKVPoolHost``...): the anchor of the
            controller's ``HostPoolGroup``.
        rec: the recorder.
        tier: the host tier's name.
        gpu_tier: the tier backups come from.
        page_bytes: bytes per host page (default: this pool's own).

    Raises:
        AdapterError: not a host pool, or already instrumented.

    Example:
        >>> inst = instrument_host_pool(host_pool, rec)  # doctest: +SKIP
        >>> inst.unwrap()                                # doctest: +SKIP
    """
    def make(active: bool) -> HostInstrumentation:
        page = int(getattr(host_pool, "page_size", 1) or 1)
        pages = int(getattr(host_pool, "size", 0)) // page
        size = page_bytes if page_bytes is not None else \
            page * int(getattr(host_pool, "size_per_token", 0))
        add = rec.add_tier if active else TierRecorder
        return HostInstrumentation(host_pool, rec, add(tier, pages, page, size), active,
                                   gpu_tier)

    inst = instrument(host_pool, HOST_SPEC, make)
    if inst.active:
        inst.tier.set_resident_source(inst.resident)
        inst.on_unwrap(lambda: inst.tier.set_resident_source(None))
    return inst


def instrument_cache_controller(controller: Any, rec: Recorder, *, tier: str = HOST,
                                gpu_tier: str = GPU) -> ControllerInstrumentation:
    """Count a HiCache controller's backups, load-backs and refused backups.

    ``controller`` is ``tree_cache.cache_controller`` after ``init_hicache`` (SGLang
    0.5.23: a ``HybridCacheController`` over a ``HostPoolGroup``). The group's anchor
    pool is instrumented too (as :func:`instrument_host_pool`, page bytes summed over
    the group) unless it already is; instrument the GPU side first
    (:func:`~kvobs.adapters.sglang.instrument_token_allocator`) so that a refused page
    that is freed can drop again.

    Raises:
        AdapterError: not a HiCacheController, its host pool is not a host pool, or
            already instrumented.

    Example:
        >>> inst = instrument_cache_controller(tree.cache_controller, rec)  # doctest: +SKIP
        >>> inst.unwrap()                                                   # doctest: +SKIP
    """
    if not class_names(controller) & set(CONTROLLER_SPEC.kinds):
        raise AdapterError(f"{CONTROLLER_COMPONENT}: expected a HiCacheController, got "
                           f"{type(controller).__qualname__}")
    group = getattr(controller, "mem_pool_host", None)
    pool = host_pools(group)[0]
    if not class_names(pool) & set(HOST_KINDS):
        raise AdapterError(f"{CONTROLLER_COMPONENT}: the controller's host pool (anchor "
                           f"of {type(group).__qualname__}) is a "
                           f"{type(pool).__qualname__}, not a HostKVCache")
    pool_bytes = pool_token_bytes(group)
    existing: HostInstrumentation | None = getattr(pool, MARKER, None)
    host = existing or instrument_host_pool(
        pool, rec, tier=tier, gpu_tier=gpu_tier,
        page_bytes=int(getattr(pool, "page_size", 1) or 1) * sum(pool_bytes.values()))
    inst = instrument(controller, CONTROLLER_SPEC,
                      lambda active: ControllerInstrumentation(controller, host, pool_bytes,
                                                               active))
    if existing is None:           # the pool is ours: it goes with the controller
        inst.on_unwrap(host.unwrap)
        if not inst.active:
            host.unwrap()
    return inst
