"""SGLang 0.5.23 HiCache: the host pool (``HostKVCache``) and its ``HiCacheController``.

A host block is one host *page* (``page_size`` tokens). Every reserved host page holds
backed-up KV, so the host tier's pages are all cached (none in use). Keys for the thrash
tracker are host page ids.

======================================  ==============================================
engine call                             events
======================================  ==============================================
host ``alloc`` (not None)               ``store(pages, keys)``: an offload landing
host ``alloc`` -> None                  ``rec.link(gpu, host).drop(pages)``: host full
host ``free``                           ``evict(pages, "other", keys)`` (the pool is
                                        not told why; HiCache host eviction calls it)
host ``clear``                          ``evict(cached, "reset")``
controller ``write`` (not None)         ``rec.link(gpu, host).transfer(pages, bytes)``
controller ``load`` (not None)          ``rec.link(host, gpu).transfer(pages, bytes)``
                                        and, on the host, ``reuse(pages, keys)`` +
                                        ``free(pages, cached=True)``: a host hit read
                                        back; the host copy stays cached
======================================  ==============================================

Transfers count when the controller accepts them (host or device pages reserved and
the copy queued; SGLang then copies on its own transfer streams), with no duration:
SGLang times them only with device events. So the host's stores equal the gpu->host
pages transferred whenever host pages are only reserved by ``write``.

Example:
    >>> inst = instrument_cache_controller(controller, rec)  # doctest: +SKIP
    >>> rec.snapshot().link("gpu", "host").blocks            # doctest: +SKIP
    0
"""

from __future__ import annotations

from typing import Any

from kvobs.adapters._hooks import (
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

HOST_COMPONENT = "sglang.host_pool"
CONTROLLER_COMPONENT = "sglang.cache_controller"


class HostInstrumentation(Instrumentation):
    """Wrappers on one SGLang host pool; ``tier`` counts in host pages."""

    def __init__(self, pool: Any, rec: Recorder | None, tier: TierRecorder, active: bool,
                 gpu_tier: str) -> None:
        super().__init__(pool, HOST_COMPONENT, active, rec, tier)
        self.page = int(getattr(pool, "page_size", 1) or 1)
        self.gpu_tier = gpu_tier

    def pages(self, indices: Any) -> list[int]:
        """Host page ids of token ``indices`` (pages are reserved whole)."""
        return (indices[:: self.page] // self.page).tolist()  # type: ignore[no-any-return]

    def resident(self) -> tuple[int, int]:
        """``(in_use, cached)`` pages of the pool: every reserved page holds KV."""
        pool = self.target
        return 0, (int(pool.size) - int(pool.available_size())) // self.page


def _reserved(inst: HostInstrumentation, state: None, indices: Any, need_size: int) -> None:
    if indices is None:
        inst.rec.link(inst.gpu_tier, inst.tier.name).drop(need_size // inst.page)
    else:
        inst.tier.store(need_size // inst.page, keys=inst.pages(indices))


def _released(inst: HostInstrumentation, state: None, freed: Any, indices: Any) -> None:
    if freed:
        keys = sorted(set((indices.cpu() // inst.page).tolist()))
        inst.tier.evict(len(keys), "other", keys=keys)


def _clearing(inst: HostInstrumentation) -> int:
    return inst.resident()[1]


def _cleared(inst: HostInstrumentation, cached: int, result: Any) -> None:
    if cached:
        inst.tier.evict(cached, "reset")


HOST_SPEC = AdapterSpec(HOST_COMPONENT, ("HostKVCache",), (
    Hook("alloc", ("need_size",), "store, drop", after=_reserved),
    Hook("free", ("indices",), "evict", after=_released),
    Hook("clear", (), "evict", before=_clearing, after=_cleared),
), state=("size", "page_size", "size_per_token", "available_size"))


class ControllerInstrumentation(Instrumentation):
    """Wrappers on one ``HiCacheController``; transfers go to ``rec``'s links."""

    def __init__(self, controller: Any, host: HostInstrumentation, active: bool) -> None:
        super().__init__(controller, CONTROLLER_COMPONENT, active, host.rec, host.tier)
        self.host = host
        self.token_bytes = int(getattr(controller.mem_pool_host, "size_per_token", 0))


def _written(inst: ControllerInstrumentation, state: None, host_indices: Any,
             device_indices: Any, *args: Any, **kwargs: Any) -> None:
    if host_indices is not None:
        host = inst.host
        inst.rec.link(host.gpu_tier, host.tier.name).transfer(
            len(host_indices) // host.page, len(host_indices) * inst.token_bytes)


def _loaded(inst: ControllerInstrumentation, state: None, device_indices: Any,
            host_indices: Any, *args: Any, **kwargs: Any) -> None:
    if device_indices is not None:
        host = inst.host
        pages = len(host_indices) // host.page
        inst.rec.link(host.tier.name, host.gpu_tier).transfer(
            pages, len(host_indices) * inst.token_bytes)
        host.tier.reuse(pages, keys=host.pages(host_indices))
        host.tier.free(pages, cached=True)


CONTROLLER_SPEC = AdapterSpec(CONTROLLER_COMPONENT, ("HiCacheController",), (
    Hook("write", ("device_indices",), "transfer", after=_written),
    Hook("load", ("host_indices",), "transfer, reuse, free", after=_loaded),
), state=("mem_pool_host",))


def instrument_host_pool(host_pool: Any, rec: Recorder, *, tier: str = HOST,
                         gpu_tier: str = GPU) -> HostInstrumentation:
    """Count an SGLang HiCache host pool (``HostKVCache``) as tier ``tier`` of ``rec``.

    Args:
        host_pool: the scheduler's host pool (``MHATokenToKVPoolHost``...).
        rec: the recorder.
        tier: the host tier's name.
        gpu_tier: the tier backups come from (drops go to ``gpu_tier -> tier``).

    Raises:
        AdapterError: not a host pool, or already instrumented.

    Example:
        >>> inst = instrument_host_pool(host_pool, rec)  # doctest: +SKIP
        >>> inst.unwrap()                                # doctest: +SKIP
    """
    def make(active: bool) -> HostInstrumentation:
        page = int(getattr(host_pool, "page_size", 1) or 1)
        pages = int(getattr(host_pool, "size", 0)) // page
        page_bytes = page * int(getattr(host_pool, "size_per_token", 0))
        add = rec.add_tier if active else TierRecorder
        return HostInstrumentation(host_pool, rec, add(tier, pages, page, page_bytes), active,
                                   gpu_tier)

    inst = instrument(host_pool, HOST_SPEC, make)
    if inst.active:
        inst.tier.set_resident_source(inst.resident)
        inst.on_unwrap(lambda: inst.tier.set_resident_source(None))
    return inst


def instrument_cache_controller(controller: Any, rec: Recorder, *, tier: str = HOST,
                                gpu_tier: str = GPU) -> ControllerInstrumentation:
    """Count a ``HiCacheController``'s offloads (``write``) and onloads (``load``).

    Its host pool is instrumented too (as :func:`instrument_host_pool`) unless it already
    is; the GPU side is :func:`~kvobs.adapters.sglang.instrument_token_allocator` of the
    controller's allocator (``load`` allocates device pages there).

    Raises:
        AdapterError: not a HiCacheController, or already instrumented.

    Example:
        >>> inst = instrument_cache_controller(controller, rec)  # doctest: +SKIP
        >>> inst.unwrap()                                        # doctest: +SKIP
    """
    if not class_names(controller) & set(CONTROLLER_SPEC.kinds):
        raise AdapterError(f"{CONTROLLER_COMPONENT}: expected a HiCacheController, got "
                           f"{type(controller).__qualname__}")
    pool = controller.mem_pool_host
    existing: HostInstrumentation | None = getattr(pool, MARKER, None)
    host = existing or instrument_host_pool(pool, rec, tier=tier, gpu_tier=gpu_tier)
    inst = instrument(controller, CONTROLLER_SPEC,
                      lambda active: ControllerInstrumentation(controller, host, active))
    if existing is None:           # the pool is ours: it goes with the controller
        inst.on_unwrap(host.unwrap)
        if not inst.active:
            host.unwrap()
    return inst
