"""Engine-side truth for the reuse-profile tests, shared by the engine test beds.

``Media`` follows an engine's own KV cache events (``BlockStored`` / ``BlockRemoved`` /
``AllBlocksCleared``, vLLM's event classes, which SGLang reuses) to the distinct blocks it
holds on any medium: the size of the LRU cache the profile models. ``spy_written`` keeps
every key an adapter reports as written to the profile, and passes them on or not (the
"lookups alone" comparison).

Example:
    >>> stored = type("BlockStored", (), {"block_hashes": [1, 2], "medium": "GPU"})()
    >>> media = Media()
    >>> media.feed([stored], default_medium="GPU")
    >>> len(media.where)
    2
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from typing import Any


class Media:
    """The media each block is held on, after the events fed so far."""

    def __init__(self) -> None:
        self.where: dict[object, set[str]] = {}

    def feed(self, events: Iterable[Any], default_medium: str | None = None) -> None:
        """Apply ``events`` in order (an event without a medium is on ``default_medium``)."""
        where = self.where
        for event in events:
            kind = type(event).__name__
            medium = str(getattr(event, "medium", None) or default_medium)
            if kind == "AllBlocksCleared":
                where.clear()
            for block in getattr(event, "block_hashes", ()) or ():
                media = where.setdefault(block, set())
                if kind == "BlockStored":
                    media.add(medium)
                elif kind == "BlockRemoved":
                    media.discard(medium)
                    if not media:
                        del where[block]


def spy_written(rec: Any, forward: bool = True) -> list[Hashable]:
    """Every key the adapters report through ``rec.written`` from now on, in order; passed
    on to the recorder only with ``forward`` (without, the profile sees lookups alone)."""
    written: list[Hashable] = []
    write = rec.written

    def report(keys: Sequence[Hashable]) -> None:
        written.extend(keys)
        if forward:
            write(keys)

    rec.written = report
    return written
