"""vLLM 0.33 offloading *tiering* (``v1/kv_offload/tiering/``) -> the disk and remote tiers.

With ``spec_name: TieringOffloadingSpec`` the offloading connector's manager is a
``TieringOffloadingManager``: a CPU primary tier (a ``CPUOffloadingManager``, kvobs's
``host`` tier, instrumented by :mod:`kvobs.adapters.vllm.offloading`) and secondary tiers
that only talk to it. Every chunk landing in host memory is *cascaded* to every
secondary tier (host -> disk), and a lookup that misses host but hits a secondary tier
*promotes* the chunk back into host memory (disk -> host) before the GPU loads it.

Each secondary tier becomes one kvobs tier, by what vLLM says it is:

==========================================  ======================================
vLLM secondary tier                          kvobs tier
==========================================  ======================================
file system (``fs``), storage medium, local  ``disk``
object store (``obj``), locality ``REMOTE``  ``remote``
peer (``p2p``), hit source ``p2p``           ``remote``
CPU medium (``example``)                     ``host_secondary``
==========================================  ======================================

(a second tier of the same kind gets ``_2``, ``_3``...). One block is one chunk, as on
the host tier (vLLM writes one file or object per chunk), so transfers host <-> disk
count blocks of both tiers alike. Per secondary tier:

* a cascade that lands (``get_finished_jobs`` reports the store job) -> ``store`` of the
  chunks written and a ``host -> disk`` transfer of them (bytes and seconds as the tier
  reports them); a failed one -> ``fail``. vLLM writes a chunk again when it is
  cascaded again (a promotion refused for a full host tier makes the request recompute
  it): the file is replaced, counted as ``evict(reason="other")`` of the old copy and a
  ``store`` of the new one, so ``kvobs_block_evictions_total{tier="disk",
  reason="other"}`` reads the rewrites and stores equal the blocks transferred;
* a promotion submitted (``submit_load``) -> ``reuse`` (cached -> in use while read);
  landed -> ``free(cached=True)`` and a ``disk -> host`` transfer of the chunks read;
  chunks that failed -> ``fail``;
* occupancy: chunks this process wrote (cached) and chunks being read (in use).
  Secondary tiers never evict otherwise (vLLM's file-system tier keeps every file,
  also across ``reset_cache``). Files written before this process started (a persistent or shared
  directory) are not in the occupancy; their hits and promotions are counted;
* capacity: the file system's size (``shutil.disk_usage``) in chunks for a file-system
  tier; a tier with no size (an object store) reads as the chunks it holds.

Prefix hits served from disk: the ``TieringOffloadingManager.prepare_load`` call that
pins chunks for the GPU asks ``get_load_source`` (what vLLM's own ``hits_by_source``
reads) per chunk; chunks from a ``disk`` source are left in :attr:`TieringInstrumentation.
disk_hits` for the lookup adapter, which records them as ``disk_hit`` tokens (and the
rest of the host-loaded tokens as ``host_hit``).

The adapter keeps one key per chunk on disk (about 100 bytes each) to tell new chunks
from rewrites.

Example:
    >>> inst = instrument_tiering(scheduler.connector.connector_scheduler.manager, rec,
    ...                           block_tokens=64)                   # doctest: +SKIP
    >>> rec.snapshot().tier("disk").stores                            # doctest: +SKIP
    >>> inst.unwrap()                                                 # doctest: +SKIP
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Hashable
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

from kvobs.adapters.api import AdapterSpec, Hook, Instrumentation, instrument, warn_once
from kvobs.adapters.vllm.lookups import TierHits
from kvobs.recorder import LinkRecorder, Recorder, TierRecorder
from kvobs.tiers import DISK, HOST

TIERING_COMPONENT = "vllm.tiering_manager"
SECONDARY_COMPONENT = "vllm.secondary_tier"
REMOTE = "remote"
HOST_SECONDARY = "host_secondary"


def secondary_tier_name(tier: Any) -> str:
    """The kvobs tier a vLLM secondary tier maps onto (before de-duplication)."""
    locality = getattr(getattr(tier, "locality", None), "value", None)
    source = getattr(getattr(tier, "cache_hit_source", None), "value", None)
    medium = getattr(getattr(tier, "medium", None), "value", None)
    if locality == "REMOTE" or source == "p2p" or getattr(tier, "tier_type", "") == "obj":
        return REMOTE
    if medium == "CPU":
        return HOST_SECONDARY
    if medium == "STORAGE" or source == DISK:
        return DISK
    return REMOTE


def secondary_capacity(tier: Any) -> int | None:
    """Chunks a secondary tier can hold: its file system's size; None when unknown."""
    mapper = getattr(tier, "file_mapper", None)
    block_bytes = int(getattr(tier, "block_size_bytes", 0) or 0)
    if mapper is None or block_bytes <= 0 or getattr(tier, "tier_type", "") == "obj":
        return None
    root = os.path.dirname(mapper.get_config_file_path())
    return shutil.disk_usage(root).total // block_bytes


class SecondaryInstrumentation(Instrumentation):
    """Wrappers on one secondary tier: jobs in flight and the chunks it holds."""

    def __init__(self, target: Any, active: bool, rec: Recorder, tier: TierRecorder,
                 cascade: LinkRecorder, promote: LinkRecorder, sized: bool) -> None:
        super().__init__(target, SECONDARY_COMPONENT, active, rec, tier)
        self.cascade = cascade    # host -> this tier
        self.promote = promote    # this tier -> host
        self.sized = sized        # capacity from the file system (else: what it holds)
        self.on_tier: set[Hashable] = set()     # chunks written by this process
        self.reading: dict[Hashable, int] = {}  # chunk -> promotions in flight
        # job id -> (is_store, keys, chunks read from known ones, submitted_at)
        self.jobs: dict[int, tuple[bool, list[Hashable], list[Hashable], float]] = {}

    def resident(self) -> tuple[int, int]:
        """``(in_use, cached)`` chunks: being read, and held otherwise."""
        reading = len(self.reading)
        return reading, len(self.on_tier) - reading


def _store_submitted(inst: SecondaryInstrumentation, state: None, result: None,
                     job: Any) -> None:
    inst.jobs[job.job_id] = (True, list(job.keys), [], time.perf_counter())


def _load_submitted(inst: SecondaryInstrumentation, state: None, result: None,
                    job: Any) -> None:
    keys = list(job.keys)
    known = [k for k in keys if k in inst.on_tier]
    starting = [k for k in known if k not in inst.reading]
    for key in known:
        inst.reading[key] = inst.reading.get(key, 0) + 1
    if starting:
        inst.tier.reuse(len(starting))
    inst.jobs[job.job_id] = (False, keys, known, time.perf_counter())


def _finished(inst: SecondaryInstrumentation, state: None, results: Any) -> None:
    if not isinstance(results, (list, tuple)):
        # an iterator would be consumed before vLLM reads it: count nothing
        warn_once(f"{SECONDARY_COMPONENT}:iterator", "kvobs_adapter_unsupported_version",
                  component=SECONDARY_COMPONENT, cls=type(inst.target).__qualname__,
                  problems=["get_finished_jobs() returns an iterator, not a list"],
                  action="not counting this tier's finished jobs")
        return
    now = time.perf_counter()
    for result in results:
        job = inst.jobs.pop(result.job_id, None)
        if job is None:
            continue  # submitted before kvobs wrapped the tier
        is_store, keys, known, submitted_at = job
        seconds = result.transfer_time
        if seconds is None:
            seconds = now - submitted_at
        nbytes = int(result.transfer_bytes or 0)
        if is_store:
            _cascade_landed(inst, keys, bool(result.success), nbytes, seconds)
        else:
            _promotion_landed(inst, result, keys, known, nbytes, seconds)


def _cascade_landed(inst: SecondaryInstrumentation, keys: list[Hashable], success: bool,
                    nbytes: int, seconds: float) -> None:
    if not success:
        inst.cascade.fail(len(keys), nbytes)
        return
    written = list(dict.fromkeys(keys))
    replaced = sum(1 for k in written if k in inst.on_tier)
    inst.on_tier.update(written)
    if not inst.sized and len(inst.on_tier) > inst.tier.capacity_blocks:
        inst.tier.set_capacity(len(inst.on_tier))
    if replaced:  # the file is replaced: the old copy goes, the new one lands
        inst.tier.evict(replaced, "other")
    inst.tier.store(len(written))
    inst.cascade.transfer(len(written), nbytes, seconds)


def _promotion_landed(inst: SecondaryInstrumentation, result: Any, keys: list[Hashable],
                      known: list[Hashable], nbytes: int, seconds: float) -> None:
    done = 0
    for key in known:
        left = inst.reading.get(key, 0) - 1
        if left > 0:
            inst.reading[key] = left
        else:
            inst.reading.pop(key, None)
            done += 1
    if done:
        inst.tier.free(done, cached=True)
    read = len(keys) if result.success else len(result.successful_keys or ())
    if read:  # a partial failure: the bytes of the chunks that landed
        inst.promote.transfer(read, nbytes * read // max(len(keys), 1), seconds)
    if read < len(keys):
        inst.promote.fail(len(keys) - read)


SECONDARY_SPEC = AdapterSpec(SECONDARY_COMPONENT, ("SecondaryTierManager",), (
    Hook("submit_store", ("job_metadata",), "track", after=_store_submitted),
    Hook("submit_load", ("job_metadata",), "reuse", after=_load_submitted),
    Hook("get_finished_jobs", (), "store, evict, transfer, free, fail", after=_finished),
), state=("block_size_bytes",))


@dataclass
class TieringInstrumentation:
    """The instrumentations of one ``TieringOffloadingManager`` and its secondary tiers.

    ``tiers`` maps each kvobs tier name to its secondary tier's instrumentation;
    ``disk_hits`` holds per-request prefix-hit tokens served from disk (see the module
    docstring); ``unwrap()`` restores every object.
    """

    manager: ManagerInstrumentation | None = None
    tiers: dict[str, SecondaryInstrumentation] = field(default_factory=dict)
    disk_hits: TierHits = field(default_factory=lambda: TierHits(1))

    @property
    def parts(self) -> list[Instrumentation]:
        """Every instrumentation, the manager's first."""
        return [*([self.manager] if self.manager else []), *self.tiers.values()]

    @property
    def active(self) -> bool:
        """True when the manager and every secondary tier are instrumented."""
        return bool(self.parts) and all(part.active for part in self.parts)

    def unwrap(self) -> None:
        """Restore every wrapped object; safe to call twice."""
        for part in reversed(self.parts):
            part.unwrap()


class ManagerInstrumentation(Instrumentation):
    """The wrapper on a ``TieringOffloadingManager``; ``disk_hits`` is where it leaves
    the chunks each request loads that came from disk."""

    def __init__(self, manager: Any, active: bool, rec: Recorder, disk_hits: TierHits) -> None:
        super().__init__(manager, TIERING_COMPONENT, active, rec)
        self.disk_hits = disk_hits


def _load_sources(inst: ManagerInstrumentation, keys: Any, req_context: Any) -> None:
    source = inst.target.get_load_source
    disk = sum(1 for key in keys if getattr(source(key, req_context), "value", None) == DISK)
    if disk:
        inst.disk_hits.add(req_context.req_id, disk)


MANAGER_SPEC = AdapterSpec(TIERING_COMPONENT, ("TieringOffloadingManager",), (
    Hook("prepare_load", ("keys", "req_context"), "lookup", before=_load_sources,
         reiterable=("keys",)),
), state=("primary_tier", "secondary_tiers"))


def instrument_tiering(manager: Any, rec: Recorder, *, block_tokens: int,
                       host_tier: str = HOST) -> TieringInstrumentation:
    """Count a vLLM ``TieringOffloadingManager``'s secondary tiers as kvobs tiers.

    The primary (CPU) tier is not touched here: instrument ``manager.primary_tier``
    as the host tier with :func:`~kvobs.adapters.vllm.instrument_offloading_manager`.

    Args:
        manager: the offloading connector's manager (``connector_scheduler.manager``).
        rec: the recorder.
        block_tokens: tokens per chunk (GPU block size x ``blocks_per_chunk``).
        host_tier: the tier chunks are cascaded from and promoted into.

    Example:
        >>> inst = instrument_tiering(manager, Recorder(), block_tokens=16)  # doctest: +SKIP
        >>> sorted(inst.tiers)                                               # doctest: +SKIP
        ['disk']

    Raises:
        AdapterError: not a TieringOffloadingManager, or already instrumented (parts
            wrapped before the failure are restored first).
    """
    result = TieringInstrumentation(disk_hits=TierHits(block_tokens))

    def make_manager(active: bool) -> ManagerInstrumentation:
        return ManagerInstrumentation(manager, active, rec, result.disk_hits)

    result.manager = instrument(manager, MANAGER_SPEC, make_manager)
    if not result.manager.active:
        return result
    with ExitStack() as undo:             # a tier that cannot be wrapped: none stays wrapped
        undo.callback(result.unwrap)
        for secondary in manager.secondary_tiers:
            name = _unique(secondary_tier_name(secondary), result.tiers)
            result.tiers[name] = _instrument_secondary(secondary, rec, name, block_tokens,
                                                       host_tier)
        undo.pop_all()
    return result


def _unique(name: str, taken: dict[str, Any]) -> str:
    if name not in taken:
        return name
    n = 2
    while f"{name}_{n}" in taken:
        n += 1
    return f"{name}_{n}"


def _instrument_secondary(secondary: Any, rec: Recorder, name: str, block_tokens: int,
                          host_tier: str) -> SecondaryInstrumentation:
    def make(active: bool) -> SecondaryInstrumentation:
        capacity = secondary_capacity(secondary) if active else None
        block_bytes = int(getattr(secondary, "block_size_bytes", 0) or 0)
        add = rec.add_tier if active else TierRecorder  # an unknown tier exports nothing
        tier = add(name, capacity or 0, block_tokens, block_bytes)
        links = (rec.link(host_tier, name), rec.link(name, host_tier)) if active else \
            (LinkRecorder(host_tier, name), LinkRecorder(name, host_tier))
        return SecondaryInstrumentation(secondary, active, rec, tier, *links,
                                        sized=capacity is not None)

    return instrument(secondary, SECONDARY_SPEC, make)


def tiering_manager(scheduler: Any) -> Any:
    """The ``TieringOffloadingManager`` of a scheduler's offloading connector, or None."""
    side = getattr(getattr(scheduler, "connector", None), "connector_scheduler", None)
    manager = getattr(side, "manager", None)
    if type(manager).__name__ != "TieringOffloadingManager":
        return None
    return manager
