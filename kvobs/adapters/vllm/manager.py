"""Instrument a whole vLLM scheduler side at once: GPU tier, lookups, host tier, transfers.

Example:
    >>> inst = instrument_scheduler(engine_core.scheduler, rec)   # doctest: +SKIP
    >>> [part.component for part in inst.parts]                   # doctest: +SKIP
    ['vllm.block_pool', 'vllm.kv_cache_manager', 'vllm.cpu_offloading_manager',
     'vllm.scheduler_steps', 'vllm.offloading_connector']
    >>> inst.unwrap()                                             # doctest: +SKIP
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

from kvobs.adapters.api import AdapterError, Instrumentation, class_names, warn_once
from kvobs.adapters.vllm.block_pool import instrument_block_pool
from kvobs.adapters.vllm.capacity import (
    gpu_tier_capacity,
    host_tier_capacity,
    readable_kv_cache_config,
)
from kvobs.adapters.vllm.connector import instrument_connector_scheduler
from kvobs.adapters.vllm.hisparse import hisparse_coordinator, instrument_hisparse
from kvobs.adapters.vllm.lookups import COMPONENT as LOOKUPS
from kvobs.adapters.vllm.lookups import (
    ExternalHits,
    HostHits,
    LookupInstrumentation,
    instrument_lookups,
)
from kvobs.adapters.vllm.offloading import COMPONENT as HOST_COMPONENT
from kvobs.adapters.vllm.offloading import OffloadingInstrumentation, instrument_offloading_manager
from kvobs.adapters.vllm.steps import instrument_steps
from kvobs.errors import ConfigError
from kvobs.recorder import Recorder


@dataclass
class VllmInstrumentation:
    """The instrumentations of one scheduler's objects; ``unwrap()`` undoes all of them."""

    parts: list[Instrumentation] = field(default_factory=list)

    @property
    def active(self) -> bool:
        """True when every part is instrumented (an unknown version leaves none active)."""
        return bool(self.parts) and all(part.active for part in self.parts)

    def part(self, component: str) -> Instrumentation | None:
        """The part named ``component`` (``vllm.block_pool``...), or None."""
        return next((p for p in self.parts if p.component == component), None)

    def unwrap(self) -> None:
        """Restore every wrapped object; safe to call twice."""
        for part in reversed(self.parts):
            part.unwrap()


def instrument_kv_cache_manager(manager: Any, rec: Recorder, *,
                                offloading_manager: Any = None,
                                host_block_tokens: int = 0,
                                host_block_bytes: int = 0,
                                host_chunks: int | None = None) -> VllmInstrumentation:
    """Instrument a ``KVCacheManager`` (its ``BlockPool`` and lookups) and, optionally,
    the ``CPUOffloadingManager`` of its offloading connector.

    Args:
        manager: the scheduler's ``KVCacheManager``.
        rec: the recorder.
        offloading_manager: the connector's offloading manager, if offloading is on.
        host_block_tokens: tokens per offloading chunk (required with an offloading manager).
        host_block_bytes: bytes per chunk (0 if unknown).
        host_chunks: the host tier's capacity in chunks (None: the manager's
            ``config_info()``).

    Raises:
        AdapterError: a part is not the expected kind or is already instrumented (parts
            wrapped before the failure are restored first).
    """
    if type(manager).__name__ != "KVCacheManager" and not hasattr(manager, "block_pool"):
        raise AdapterError(f"vllm: expected a KVCacheManager, got {type(manager).__qualname__}")
    if offloading_manager is not None and host_block_tokens <= 0:
        raise AdapterError("vllm: host_block_tokens must be > 0 with an offloading "
                           "manager: pass GPU block size x blocks_per_chunk")
    block_tokens, block_bytes = None, 0
    config = getattr(manager, "kv_cache_config", None)
    if readable_kv_cache_config(config):  # an unreadable config only costs the byte figures
        gpu = gpu_tier_capacity(config)
        block_tokens, block_bytes = gpu.block_tokens, gpu.block_bytes
    result = VllmInstrumentation()
    host_hits = HostHits(host_block_tokens) if offloading_manager is not None else None
    with ExitStack() as undo:
        undo.callback(result.unwrap)  # a part that cannot be wrapped restores the others
        result.parts.append(instrument_block_pool(manager.block_pool, rec,
                                                  block_tokens=block_tokens,
                                                  block_bytes=block_bytes))
        result.parts.append(instrument_lookups(manager, rec, host_hits))
        if offloading_manager is not None:
            result.parts.append(instrument_offloading_manager(
                offloading_manager, rec, block_tokens=host_block_tokens,
                block_bytes=host_block_bytes, capacity=host_chunks, host_hits=host_hits))
        undo.pop_all()
    return result


def instrument_scheduler(scheduler: Any, rec: Recorder, *, steps: bool = True,
                         offloading_spec: Any = None) -> VllmInstrumentation:
    """Instrument everything a vLLM v1 ``Scheduler`` holds that kvobs knows.

    Finds ``scheduler.kv_cache_manager`` and, when the KV connector is the offloading
    connector, its scheduler side (``OffloadingConnectorScheduler``: its transfers), its
    ``CPUOffloadingManager`` (the host tier) and chunk size; with vLLM HiSparse, its host
    pool (a primary host tier), page transfers and hot buffers
    (:mod:`kvobs.adapters.vllm.hisparse`). With vLLM's tiering
    (``TieringOffloadingManager``) the host tier is its ``primary_tier`` (a
    ``CPUPrimaryTierOffloadingManager``); the secondary tiers are instrumented by
    :func:`~kvobs.adapters.vllm.tiering.instrument_tiering` (the plugin does both).
    With ``steps`` (the default) the scheduler's own steps are timed for the measured
    prefill cost (:mod:`kvobs.adapters.vllm.steps`). ``offloading_spec`` (the
    connector's ``OffloadingSpec``, which the scheduler side does not keep) gives the host
    tier's capacity and bytes per chunk where the manager does not publish them (vLLM
    0.32); without either, the host tier has no byte series.

    Example:
        >>> inst = instrument_scheduler(scheduler, Recorder(engine="vllm"))  # doctest: +SKIP
    """
    offloading, tokens, chunk_bytes, chunks = None, 0, 0, None
    side = getattr(getattr(scheduler, "connector", None), "connector_scheduler", None)
    manager = getattr(side, "manager", None)
    host = getattr(manager, "primary_tier", manager)  # tiering: its CPU primary tier
    if side is not None and "CPUOffloadingManager" in class_names(host):
        offloading = host
        tokens = int(side.config.kv_group_configs[0].tokens_per_chunk)
        capacity = host_tier_capacity(offloading, tokens, spec=offloading_spec)
        chunk_bytes, chunks = capacity.block_bytes, capacity.blocks
    result = instrument_kv_cache_manager(scheduler.kv_cache_manager, rec,
                                         offloading_manager=offloading,
                                         host_block_tokens=tokens, host_block_bytes=chunk_bytes,
                                         host_chunks=chunks)
    if hisparse_coordinator(scheduler) is not None:
        _attach_hisparse(scheduler, rec, result)
    if steps:
        with ExitStack() as undo:
            undo.callback(result.unwrap)
            result.parts.append(instrument_steps(scheduler, rec))
            undo.pop_all()
    if offloading is not None:
        with ExitStack() as undo:
            undo.callback(result.unwrap)
            external = ExternalHits(rec)
            connector = instrument_connector_scheduler(side, rec, external=external)
            result.parts.append(connector)
            lookups = result.part(LOOKUPS)
            host = result.part(HOST_COMPONENT)
            if connector.active:
                if isinstance(lookups, LookupInstrumentation):
                    # hits as vLLM's hits_by_source splits them, deferred loads included
                    lookups.external = external
                    lookups.deferred = getattr(scheduler, "deferred_loads", None)
                    if isinstance(host, OffloadingInstrumentation):
                        host.host_hits = None
                if isinstance(host, OffloadingInstrumentation) and host.active:
                    # the connector completes one job per manager call: count each there
                    host.store_jobs, host.load_jobs = connector.offload, connector.onload
                    host.failed_loads = connector.failed_loads
            undo.pop_all()
    return result


def _attach_hisparse(scheduler: Any, rec: Recorder, result: VllmInstrumentation) -> None:
    """The HiSparse host pool, page transfers and hot buffers; a HiSparse whose objects
    kvobs cannot read leaves them uninstrumented with one warning naming what was
    missing (the GPU tier and lookups stay instrumented)."""
    try:
        lookups = result.part(LOOKUPS)
        result.parts.extend(instrument_hisparse(
            scheduler, rec, lookups if isinstance(lookups, LookupInstrumentation) else None))
    except (AttributeError, TypeError, ConfigError) as exc:
        warn_once("vllm.hisparse", "kvobs_instrument_partial", component="vllm.hisparse",
                  missing=str(exc), effect="no HiSparse host tier, page transfers or hot "
                  "buffers; the GPU tier and lookups are instrumented")
