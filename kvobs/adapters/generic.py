"""A small protocol for engines kvobs ships no adapter for.

Two ways in, both with the guarantees of the shipped adapters (the engine's results and
exceptions pass through untouched; a kvobs failure is counted and logged, never raised):

* **callbacks**: the engine calls :class:`KVCacheCallbacks` at its allocate / free /
  lookup / transfer points (six methods, tier names as strings);
* **wrapping**: :func:`instrument_methods` wraps methods of one allocator instance and
  calls ``after(result, *args, **kwargs)`` once each returns, so an allocator can be
  observed without editing it.

Example (a free-list allocator kvobs knows nothing about)::

    >>> from kvobs.recorder import Recorder
    >>> class FreeList:
    ...     def __init__(self, n): self.free = list(range(n))
    ...     def alloc(self, n): return [self.free.pop() for _ in range(n)]
    ...     def release(self, ids): self.free.extend(ids)
    >>> rec = Recorder(engine="mine", model="llama-3-8b")
    >>> kv = KVCacheCallbacks(rec, {"gpu": (64, 16, 131072)})
    >>> pool = FreeList(64)
    >>> inst = instrument_methods(pool, rec, "mine.freelist", {
    ...     "alloc": lambda ids, n: kv.allocate("gpu", len(ids)),
    ...     "release": lambda _, ids: kv.free("gpu", len(ids)),
    ... })
    >>> pool.release(pool.alloc(3)[:2]); kv.lookup(100, gpu_hit=48)
    >>> t = rec.snapshot().tier("gpu"); (t.allocations, t.frees, t.in_use_blocks)
    (3, 2, 1)
    >>> inst.unwrap()
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from kvobs.adapters._hooks import Instrumentation, begin
from kvobs.errors import ConfigError
from kvobs.recorder import Recorder, TierRecorder

COMPONENT = "generic"
TierSize = tuple[int, int, int]  # capacity_blocks, block_tokens, block_bytes


class KVCacheCallbacks:
    """The six events kvobs needs from an engine, keyed by tier name.

    Args:
        rec: the recorder to count into.
        tiers: ``{tier: (capacity_blocks, block_tokens, block_bytes)}``, fastest first.

    Raises:
        ConfigError: a tier name or size is invalid (at construction, never per call).
    """

    def __init__(self, rec: Recorder, tiers: Mapping[str, TierSize]) -> None:
        if not tiers:
            raise ConfigError("tiers must name at least one tier, e.g. {'gpu': (blocks, "
                              "block_tokens, block_bytes)}")
        self.rec = rec
        self._tiers: dict[str, TierRecorder] = {}
        for name, size in tiers.items():
            if not (isinstance(size, tuple) and len(size) == 3):
                raise ConfigError(f"tiers[{name!r}] must be (capacity_blocks, block_tokens, "
                                  f"block_bytes), got {size!r}")
            self._tiers[name] = rec.add_tier(name, *size)

    def _tier(self, name: str) -> TierRecorder:
        return self._tiers.get(name) or self.rec.tier(name)

    def allocate(self, tier: str, blocks: int) -> None:
        """``blocks`` free blocks of ``tier`` were handed to requests."""
        try:
            self._tier(tier).allocated(blocks)
        except Exception as exc:
            self.rec.error(COMPONENT, exc)

    def free(self, tier: str, blocks: int, cached: bool = False) -> None:
        """``blocks`` were released; ``cached`` if they keep reusable KV data."""
        try:
            self._tier(tier).freed(blocks, cached=cached)
        except Exception as exc:
            self.rec.error(COMPONENT, exc)

    def hit(self, tier: str, blocks: int) -> None:
        """``blocks`` cached blocks were taken back into use by a prefix hit."""
        try:
            self._tier(tier).reused(blocks)
        except Exception as exc:
            self.rec.error(COMPONENT, exc)

    def evict(self, tier: str, blocks: int, reason: str = "capacity") -> None:
        """``blocks`` cached blocks were dropped (capacity, explicit, reset, other)."""
        try:
            self._tier(tier).evicted(blocks, reason)
        except Exception as exc:
            self.rec.error(COMPONENT, exc)

    def lookup(self, tokens: int, gpu_hit: int = 0, host_hit: int = 0, disk_hit: int = 0) -> None:
        """One prefix lookup of ``tokens`` tokens and where its hits were found."""
        try:
            self.rec.lookup(tokens, gpu_hit=gpu_hit, host_hit=host_hit, disk_hit=disk_hit)
        except Exception as exc:
            self.rec.error(COMPONENT, exc)

    def transfer(self, src: str, dst: str, blocks: int, nbytes: int, seconds: float,
                 ok: bool = True) -> None:
        """A batch moved from ``src`` to ``dst`` (device time in ``seconds``), or failed."""
        try:
            link = self.rec.link(src, dst)
            if ok:
                link.completed(blocks, nbytes, seconds)
            else:
                link.failed(blocks, nbytes)
        except Exception as exc:
            self.rec.error(COMPONENT, exc)


AfterHook = Callable[..., None]


def instrument_methods(obj: Any, rec: Recorder, component: str,
                       hooks: Mapping[str, AfterHook]) -> Instrumentation:
    """Wrap methods of ``obj`` (this instance only) to call ``hooks[name](result, *args,
    **kwargs)`` after each returns normally.

    Raises:
        AdapterError: ``obj`` is already instrumented or takes no instance attributes.
        ConfigError: a hooked method does not exist on ``obj``.
    """
    missing = [name for name in hooks if not callable(getattr(obj, name, None))]
    if missing:
        raise ConfigError(f"{component}: {type(obj).__name__} has no method(s) "
                          f"{', '.join(missing)}: name methods the object defines")
    kinds = (type(obj).__name__,)
    inst = begin(obj, kinds, (), component, lambda active: Instrumentation(obj, component, active))
    for name, after in hooks.items():
        inst.install(name, _after(getattr(obj, name), after, rec, component))
    return inst


def _after(original: Callable[..., Any], after: AfterHook, rec: Recorder,
           component: str) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        try:
            after(result, *args, **kwargs)
        except Exception as exc:
            rec.error(component, exc)
        return result

    wrapper.__name__ = getattr(original, "__name__", "wrapper")
    wrapper.__doc__ = getattr(original, "__doc__", None)
    return wrapper
