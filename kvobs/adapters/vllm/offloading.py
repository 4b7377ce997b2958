"""vLLM 0.33 ``CPUOffloadingManager`` (scheduler side of CPU offloading) -> the host tier.

One host block is one offloading *chunk* (``blocks_per_chunk`` GPU blocks). Mapping:

* ``prepare_store`` -> chunks allocated for writing (free -> in use), ``evicted_keys``
  -> host evictions (capacity) and wasted-offload tracking; ``None`` -> the offered
  chunks are dropped (the host tier is full of chunks being read or written);
* ``complete_store`` -> written chunks become cached (and count as offloaded for thrash
  tracking); a failed store frees them and counts a GPU->host transfer failure;
* ``prepare_load`` -> cached chunks taken for reading (a host hit: reuse, onload for
  thrash tracking); ``complete_load`` -> back to cached;
* ``reset_cache`` -> everything dropped (reason ``reset``).

Occupancy is read from the manager at collection: resident = allocated chunks (in use =
being written or read, cached = readable and evictable). This is the figure vLLM's own
``kv_offload`` usage gauge misses: a full but idle CPU tier reads 100% resident here.

Example:
    >>> from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager  # doctest: +SKIP
    >>> manager = CPUOffloadingManager(num_chunks=1024, cache_policy="arc")
    >>> inst = instrument_offloading_manager(manager, rec, block_tokens=64,
    ...                                      block_bytes=8 << 20)  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from kvobs.adapters._hooks import Hook, Instrumentation, begin
from kvobs.adapters.vllm.lookups import HostHits
from kvobs.recorder import Recorder, TierRecorder
from kvobs.tiers import GPU, HOST

COMPONENT = "vllm.cpu_offloading_manager"
HOOKS = (
    Hook("lookup", ("key", "req_context")),
    Hook("prepare_store", ("keys", "req_context")),
    Hook("complete_store", ("keys", "req_context", "success")),
    Hook("prepare_load", ("keys", "req_context")),
    Hook("complete_load", ("keys", "req_context")),
    Hook("reset_cache", ()),
)
STATE = ("_num_chunks", "_num_allocated_chunks", "_free_list", "_num_evictable_cache_chunks",
         "_policy.get")


class OffloadingInstrumentation(Instrumentation):
    """Wrappers on one offloading manager, with per-key lookup tallies."""

    def __init__(self, manager: Any, tier: TierRecorder, active: bool) -> None:
        super().__init__(manager, COMPONENT, active)
        self.tier = tier
        self.lookups = 0       # lookup() calls (one key each)
        self.lookup_hits = 0   # of them HIT (readable now)
        self.host_hits: HostHits | None = None

    def resident(self) -> tuple[int, int]:
        """``(in_use, cached)`` chunks read from the manager."""
        m = self.target
        allocated = m._num_allocated_chunks - len(m._free_list)
        cached = m._num_evictable_cache_chunks
        return allocated - cached, cached


def instrument_offloading_manager(manager: Any, rec: Recorder, *, block_tokens: int,
                                  block_bytes: int = 0, tier: str = HOST, gpu_tier: str = GPU,
                                  host_hits: HostHits | None = None) -> OffloadingInstrumentation:
    """Count a vLLM ``CPUOffloadingManager`` as tier ``tier`` of ``rec``.

    Args:
        manager: the offloading connector's manager (``spec.get_manager()``).
        rec: the recorder.
        block_tokens: tokens per chunk (GPU block size x ``blocks_per_chunk``).
        block_bytes: bytes per chunk (0 if unknown).
        tier: this tier's name; ``gpu_tier`` is the tier chunks are offloaded from.
        host_hits: where to leave host hits for the lookup adapter to attribute.

    Raises:
        AdapterError: not an offloading manager, or already instrumented.
    """
    def make(active: bool) -> OffloadingInstrumentation:
        capacity = int(getattr(manager, "_num_chunks", 0))
        add = rec.add_tier if active else TierRecorder  # an unknown manager exports nothing
        return OffloadingInstrumentation(
            manager, add(tier, capacity, block_tokens, block_bytes), active)

    inst = begin(manager, ("CPUOffloadingManager",), HOOKS, COMPONENT, make, STATE)
    if inst.active:
        inst.host_hits = host_hits
        _install(inst, manager, rec, rec.link(gpu_tier, tier))
        inst.tier.set_resident_source(inst.resident)
        inst.on_unwrap(lambda: inst.tier.set_resident_source(None))
    return inst


def _install(inst: OffloadingInstrumentation, manager: Any, rec: Recorder, offload: Any) -> None:
    host, thrash, error = inst.tier, rec.thrash, rec.error
    policy_get = manager._policy.get
    lookup = manager.lookup
    prepare_store = manager.prepare_store
    complete_store = manager.complete_store
    prepare_load = manager.prepare_load
    complete_load = manager.complete_load
    reset_cache = manager.reset_cache

    def lookup_hook(key: Any, req_context: Any) -> Any:
        result = lookup(key, req_context)
        try:
            inst.lookups += 1
            if result.name == "HIT":
                inst.lookup_hits += 1
        except Exception as exc:
            error(COMPONENT, exc)
        return result

    def prepare_store_hook(keys: Collection[Any], req_context: Any) -> Any:
        keys = list(keys)
        output = prepare_store(keys, req_context)
        try:
            if output is None:
                offload.dropped(len(keys))
            else:
                if output.keys_to_store:
                    host.allocated(len(output.keys_to_store))
                if output.evicted_keys:
                    host.evicted(len(output.evicted_keys), "capacity")
                    thrash.evicted(output.evicted_keys)
        except Exception as exc:
            error(COMPONENT, exc)
        return output

    def complete_store_hook(keys: Collection[Any], req_context: Any, success: bool = True) -> None:
        keys = list(keys)
        try:
            pending = [k for k in keys if (c := policy_get(k)) is not None and not c.is_ready]
        except Exception as exc:
            error(COMPONENT, exc)
            pending = []
        complete_store(keys, req_context, success)
        try:
            if not pending:
                return
            if success:
                host.freed(len(pending), cached=True)   # written: in use -> cached
                thrash.offloaded(pending)
            else:
                host.freed(len(pending), cached=False)
                offload.failed(len(pending))
        except Exception as exc:
            error(COMPONENT, exc)

    def prepare_load_hook(keys: Collection[Any], req_context: Any) -> Any:
        keys = list(keys)
        try:
            idle = sum(1 for k in keys if (c := policy_get(k)) is not None and c.ref_cnt == 0)
        except Exception as exc:
            error(COMPONENT, exc)
            idle = 0
        spec = prepare_load(keys, req_context)
        try:
            host.reused(idle)  # a second reader of a chunk being read changes no state
            thrash.onloaded(keys)
            if inst.host_hits is not None:
                inst.host_hits.add(req_context.req_id, len(keys))
        except Exception as exc:
            error(COMPONENT, exc)
        return spec

    def complete_load_hook(keys: Collection[Any], req_context: Any) -> None:
        keys = list(keys)
        try:
            last = sum(1 for k in keys if (c := policy_get(k)) is not None and c.ref_cnt == 1)
        except Exception as exc:
            error(COMPONENT, exc)
            last = 0
        complete_load(keys, req_context)
        try:
            host.freed(last, cached=True)  # the last reader finished: in use -> cached
        except Exception as exc:
            error(COMPONENT, exc)

    def reset_cache_hook() -> None:
        try:
            in_use, cached = inst.resident()
        except Exception as exc:
            error(COMPONENT, exc)
            in_use = cached = 0
        reset_cache()
        try:
            host.freed(in_use, cached=False)
            host.evicted(cached, "reset")
        except Exception as exc:
            error(COMPONENT, exc)

    inst.install("lookup", lookup_hook)
    inst.install("prepare_store", prepare_store_hook)
    inst.install("complete_store", complete_store_hook)
    inst.install("prepare_load", prepare_load_hook)
    inst.install("complete_load", complete_load_hook)
    inst.install("reset_cache", reset_cache_hook)
