"""The one vocabulary every adapter speaks: what happened to KV blocks, in eight words.

Every engine adapter (vLLM, LMCache, SGLang, the generic callbacks, the reference pool)
reports through these events and nothing else, so one event means the same thing on
every engine and a fleet dashboard compares like with like. :data:`MEANINGS` defines
them (the README's table is generated from it). Block states: free, in use by a
request, cached for reuse. An *offload* is a transfer to a slower tier, an *onload* one
back to a faster tier.

Units: a tier counts in its own blocks. A transfer counts blocks of the slower tier of
the pair (for vLLM CPU offloading, one host chunk of ``blocks_per_chunk`` GPU blocks),
so the host tier's stores equal the gpu->host blocks that landed, and thrash counts the
same unit.

:class:`TierEvents` and :class:`LinkEvents` are what adapters call;
:class:`~kvobs.recorder.TierRecorder` and :class:`~kvobs.recorder.LinkRecorder`
implement them with plain integer adds, and :data:`NULL_TIER` / :data:`NULL_LINK`
discard everything (the default for an engine part kvobs could not instrument).

Example:
    >>> from kvobs.recorder import Recorder
    >>> rec = Recorder()
    >>> host: TierEvents = rec.add_tier("host", capacity_blocks=8, block_tokens=16,
    ...                                 block_bytes=4096)
    >>> host.store(2, keys=("a", "b")); host.reuse(1, keys=("a",))
    >>> offload: LinkEvents = rec.link("gpu", "host")
    >>> offload.transfer(2, 8192, 0.001)
    >>> snap = rec.snapshot()
    >>> snap.tier("host").stores, snap.tier("host").in_use_blocks, snap.link("gpu", "host").blocks
    (2, 1, 2)
    >>> NULL_TIER.allocate(5)   # does nothing
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import Protocol, runtime_checkable

#: The vocabulary: each event and what it means, in the order the README lists them.
MEANINGS: dict[str, str] = {
    "allocate": "free blocks handed to requests (free -> in use)",
    "free": "blocks released by requests: to the cache (`cached=True`: in use -> cached, "
            "they keep reusable KV) or to the free list (in use -> free)",
    "reuse": "cached blocks taken back into use by a prefix hit (cached -> in use); on a "
             "slower tier this is the start of an onload, ended by a `free` to the cache",
    "store": "an offload landing: blocks written into this tier as cached data "
             "(free -> cached)",
    "evict": "cached blocks dropped (cached -> free), with a reason: `capacity` (room was "
             "needed), `explicit` (the engine removed them), `reset`, `other`",
    "transfer": "a batch moved between two tiers: src, dst, blocks, bytes, seconds "
                "(device time where there is a device)",
    "drop": "blocks not transferred because the destination was full (refused); a block "
            "the engine offers again is counted once",
    "fail": "blocks whose transfer was attempted and failed",
}
EVENTS: tuple[str, ...] = tuple(MEANINGS)
#: Events a tier receives and events a transfer direction (a link) receives.
TIER_EVENTS: tuple[str, ...] = ("allocate", "free", "reuse", "store", "evict")
LINK_EVENTS: tuple[str, ...] = ("transfer", "drop", "fail")

Keys = Iterable[Hashable] | None


@runtime_checkable
class TierEvents(Protocol):
    """Block events of one tier (``rec.tier("gpu")``). Counts are in the tier's blocks.

    ``keys`` (block hashes, chunk keys) are optional; where given on an offload tier
    they feed the thrash tracker (a store is an offload, a reuse an onload).
    """

    def allocate(self, n: int = 1) -> None:
        """``n`` free blocks were handed to requests (free -> in use)."""

    def free(self, n: int = 1, cached: bool = False) -> None:
        """``n`` blocks were released: kept as cached data if ``cached``, else emptied."""

    def reuse(self, n: int = 1, keys: Keys = None) -> None:
        """``n`` cached blocks were taken back into use by a prefix hit."""

    def store(self, n: int = 1, keys: Keys = None) -> None:
        """``n`` blocks were written into this tier as cached data (an offload landed)."""

    def evict(self, n: int = 1, reason: str = "capacity", keys: Keys = None) -> None:
        """``n`` cached blocks were dropped (cached -> free), for ``reason``."""


@runtime_checkable
class LinkEvents(Protocol):
    """Transfers in one direction (``rec.link("gpu", "host")``)."""

    def transfer(self, blocks: int, nbytes: int, seconds: float | None = None) -> None:
        """A batch of ``blocks`` blocks (``nbytes`` bytes) landed; ``seconds`` of device
        time when the caller timed it (None: counted, not timed)."""

    def drop(self, blocks: int) -> None:
        """``blocks`` distinct blocks were refused because the destination was full."""

    def fail(self, blocks: int, nbytes: int = 0) -> None:
        """A transfer of ``blocks`` blocks was attempted and failed."""


class _NullTier:
    """Discards every tier event."""

    __slots__ = ()

    def allocate(self, n: int = 1) -> None:
        """Discard."""

    def free(self, n: int = 1, cached: bool = False) -> None:
        """Discard."""

    def reuse(self, n: int = 1, keys: Keys = None) -> None:
        """Discard."""

    def store(self, n: int = 1, keys: Keys = None) -> None:
        """Discard."""

    def evict(self, n: int = 1, reason: str = "capacity", keys: Keys = None) -> None:
        """Discard."""


class _NullLink:
    """Discards every transfer event."""

    __slots__ = ()

    def transfer(self, blocks: int, nbytes: int, seconds: float | None = None) -> None:
        """Discard."""

    def drop(self, blocks: int) -> None:
        """Discard."""

    def fail(self, blocks: int, nbytes: int = 0) -> None:
        """Discard."""


NULL_TIER: TierEvents = _NullTier()
NULL_LINK: LinkEvents = _NullLink()


def markdown_table() -> str:
    """The vocabulary as a Markdown table, for the README."""
    rows = ["| event | meaning |", "|---|---|"]
    rows += [f"| `{event}` | {meaning} |" for event, meaning in MEANINGS.items()]
    return "\n".join(rows)
