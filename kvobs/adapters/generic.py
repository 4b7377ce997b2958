"""A small protocol for engines kvobs ships no adapter for.

Two ways in, both with the guarantees of the shipped adapters (the engine's results and
exceptions pass through untouched; a kvobs failure is counted and logged, never raised):

* **callbacks**: the engine calls :class:`KVCacheCallbacks` at its allocate / free /
  reuse / store / evict / transfer / drop / fail / lookup points: the vocabulary of
  :mod:`kvobs.events`, with tier names as strings;
* **wrapping**: :func:`instrument_methods` wraps methods of one allocator instance and
  calls ``after(result, *args, **kwargs)`` once each returns, so an allocator can be
  observed without editing it (the same machinery the shipped adapters use).

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

from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Any

from kvobs.adapters.api import AdapterSpec, Hook, Instrumentation, guarded, instrument
from kvobs.errors import ConfigError
from kvobs.recorder import Recorder, TierRecorder

COMPONENT = "generic"
TierSize = tuple[int, int, int]  # capacity_blocks, block_tokens, block_bytes
Keys = Iterable[Hashable] | None


class KVCacheCallbacks:
    """The events kvobs needs from an engine, keyed by tier name (see :mod:`kvobs.events`).

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

    @guarded(COMPONENT)
    def allocate(self, tier: str, blocks: int) -> None:
        """``blocks`` free blocks of ``tier`` were handed to requests."""
        self._tier(tier).allocate(blocks)

    @guarded(COMPONENT)
    def free(self, tier: str, blocks: int, cached: bool = False) -> None:
        """``blocks`` were released; ``cached`` if they keep reusable KV data."""
        self._tier(tier).free(blocks, cached=cached)

    @guarded(COMPONENT)
    def reuse(self, tier: str, blocks: int, keys: Keys = None) -> None:
        """``blocks`` cached blocks were taken back into use by a prefix hit."""
        self._tier(tier).reuse(blocks, keys=keys)

    @guarded(COMPONENT)
    def store(self, tier: str, blocks: int, keys: Keys = None) -> None:
        """``blocks`` blocks landed in ``tier`` as cached data (an offload landed)."""
        self._tier(tier).store(blocks, keys=keys)

    @guarded(COMPONENT)
    def evict(self, tier: str, blocks: int, reason: str = "capacity", keys: Keys = None) -> None:
        """``blocks`` cached blocks were dropped (capacity, explicit, reset, other)."""
        self._tier(tier).evict(blocks, reason, keys=keys)

    @guarded(COMPONENT)
    def lookup(self, tokens: int, gpu_hit: int = 0, host_hit: int = 0, disk_hit: int = 0) -> None:
        """One prefix lookup of ``tokens`` tokens and where its hits were found."""
        self.rec.lookup(tokens, gpu_hit=gpu_hit, host_hit=host_hit, disk_hit=disk_hit)

    @guarded(COMPONENT)
    def transfer(self, src: str, dst: str, blocks: int, nbytes: int,
                 seconds: float | None = None) -> None:
        """A batch of ``blocks`` (in the slower tier's blocks) moved from ``src`` to
        ``dst``, in ``seconds`` of device time if timed."""
        self.rec.link(src, dst).transfer(blocks, nbytes, seconds)

    @guarded(COMPONENT)
    def drop(self, src: str, dst: str, blocks: int) -> None:
        """``blocks`` distinct blocks were refused: ``dst`` was full. Count a block the
        engine offers again later only once."""
        self.rec.link(src, dst).drop(blocks)

    @guarded(COMPONENT)
    def fail(self, src: str, dst: str, blocks: int, nbytes: int = 0) -> None:
        """A transfer of ``blocks`` from ``src`` to ``dst`` was attempted and failed."""
        self.rec.link(src, dst).fail(blocks, nbytes)


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
    spec = AdapterSpec(component, (type(obj).__name__,),
                       tuple(Hook(name, (), after=_call_after(after))
                             for name, after in hooks.items()))
    return instrument(obj, spec, lambda active: Instrumentation(obj, component, active, rec))


def _call_after(after: AfterHook) -> Callable[..., None]:
    def read(inst: Instrumentation, state: None, result: Any, *args: Any, **kwargs: Any) -> None:
        after(result, *args, **kwargs)

    return read
