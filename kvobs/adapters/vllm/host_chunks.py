"""The chunks a vLLM offloading manager holds, told by its public calls alone.

vLLM keeps its host tier's chunk counts private (a ``CPUOffloadingManager``'s written,
pending and evictable counters). The ``OffloadingManager`` interface every manager
implements tells the same states through its calls and their results:

* ``prepare_store`` returns the keys it allocated (now being written) and the keys it
  evicted (idle chunks, emptied);
* ``complete_store`` completes the keys of one job: each key still being written lands
  (``success``) or is emptied; keys already written are left as they are;
* ``prepare_load`` pins each key for one more reader; ``complete_load`` unpins it, and a
  chunk whose last reader finished is idle again;
* vLLM 0.34's tiering fails a promotion with ``defer_write_release(keys)``: the keys leave
  the cache but their chunks stay held until ``release_deferred_write(chunk_ids)``;
* ``reset_cache`` empties everything.

:class:`HostChunks` replays those calls. Every key it holds is a chunk the manager holds,
so it never grows past the tier's capacity.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


class HostChunks:
    """Chunks being written, being read, idle and held, per vLLM's own transitions.

    ``writing``: keys allocated and not yet completed; ``readers``: readers per key being
    read; ``ready``: written chunks (idle or being read); ``held``: chunks of failed
    promotions held out of the free pool.
    """

    __slots__ = ("held", "readers", "ready", "writing")

    def __init__(self) -> None:
        self.writing: set[Any] = set()
        self.readers: dict[Any, int] = {}
        self.ready = 0
        self.held = 0

    def resident(self) -> tuple[int, int]:
        """``(in_use, cached)``: chunks being written, read or held; idle written chunks."""
        reading = len(self.readers)
        return len(self.writing) + self.held + reading, max(self.ready - reading, 0)

    def allocated(self, keys: Iterable[Any], evicted: int) -> None:
        """``prepare_store`` allocated ``keys`` after evicting ``evicted`` idle chunks."""
        self.writing.update(keys)
        self.ready -= evicted

    def completed(self, keys: Iterable[Any], success: bool) -> list[Any]:
        """``complete_store``: the keys that were being written (landed or emptied)."""
        done = self._taken(keys)
        if success:
            self.ready += len(done)
        return done

    def deferred(self, keys: Iterable[Any]) -> int:
        """``defer_write_release``: the keys leave the cache, their chunks stay held."""
        n = len(self._taken(keys))
        self.held += n
        return n

    def _taken(self, keys: Iterable[Any]) -> list[Any]:
        """The ``keys`` being written, no longer (a key twice in one call counts once)."""
        writing, done = self.writing, []
        for key in keys:
            if key in writing:
                writing.discard(key)
                done.append(key)
        return done

    def released(self, chunks: int) -> int:
        """``release_deferred_write`` of ``chunks`` held chunks: now free."""
        n = min(chunks, self.held)
        self.held -= n
        return n

    def pinned(self, keys: Iterable[Any]) -> int:
        """``prepare_load``: one more reader per key; how many chunks were idle."""
        readers, idle = self.readers, 0
        for key in keys:
            n = readers.get(key, 0)
            if not n:
                idle += 1
            readers[key] = n + 1
        return idle

    def unpinned(self, keys: Iterable[Any]) -> int:
        """``complete_load``: one reader fewer per key; how many chunks are idle again."""
        readers, last = self.readers, 0
        for key in keys:
            n = readers.get(key)
            if n is None:  # pinned before kvobs was attached
                continue
            if n == 1:
                del readers[key]
                last += 1
            else:
                readers[key] = n - 1
        return last

    def reset(self) -> tuple[int, int]:
        """``reset_cache``: ``(in_use, cached)`` before every chunk was emptied."""
        resident = self.resident()
        self.writing.clear()
        self.readers.clear()
        self.ready = 0
        return resident
