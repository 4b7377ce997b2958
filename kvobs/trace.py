"""Block-reference traces for ``kvobs whatif``: one JSON line per prefix lookup.

Each line holds the request's prompt block hashes in order and a timestamp::

    {"blocks": ["9f86d081884c7d65", "2c26b46b68ffc68f"], "ts": 12.5}

Blocks the cache gained without a lookup (an answer written during decode) are lines
with ``"written"`` instead of ``"blocks"``: a replay makes them recent without counting
them (:meth:`kvobs.reuse.ReuseProfile.write`).

Only hashes are written (64 bits of each block key, as hex), never tokens. The file is
bounded: once ``max_bytes`` are written the writer stops and counts what it skipped.
Readers ignore other fields, so engines may add their own.

Example:
    >>> import io
    >>> out = io.StringIO()
    >>> writer = TraceWriter(out, max_bytes=1 << 20, clock=lambda: 1.5)
    >>> writer.write([1, 2, b"\\x01" * 32])
    >>> out.getvalue()
    '{"blocks":["0000000000000001","0000000000000002","0101010101010101"],"ts":1.5}\\n'
    >>> [r.blocks for r in read_trace(io.StringIO(out.getvalue()))]
    [['0000000000000001', '0000000000000002', '0101010101010101']]
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass
from typing import IO, Any

from kvobs.errors import ConfigError

_MASK64 = (1 << 64) - 1
DEFAULT_MAX_BYTES = 256 << 20


def key_hex(key: Hashable) -> str:
    """64 bits of a block key as 16 hex digits (ints and bytes keep their own bits)."""
    if isinstance(key, int):
        return format(key & _MASK64, "016x")
    if isinstance(key, (bytes, bytearray)):
        return bytes(key[:8]).hex().rjust(16, "0")
    return format(hash(key) & _MASK64, "016x")


class TraceWriter:
    """Appends one line per lookup to ``out``, up to ``max_bytes``; thread-safe."""

    def __init__(self, out: IO[str], max_bytes: int = DEFAULT_MAX_BYTES,
                 clock: Callable[[], float] = time.time) -> None:
        if max_bytes <= 0:
            raise ConfigError(f"trace max_bytes must be > 0, got {max_bytes!r}")
        self.out = out
        self.max_bytes = max_bytes
        self.clock = clock
        self.written_bytes = 0
        self.skipped_lookups = 0
        self._lock = threading.Lock()

    def write(self, keys: Sequence[Hashable], written: bool = False) -> None:
        """Record one lookup of ``keys`` (``written``: blocks written without a lookup)."""
        if self.written_bytes >= self.max_bytes:
            self.skipped_lookups += 1
            return
        field = "written" if written else "blocks"
        line = json.dumps({field: [key_hex(k) for k in keys], "ts": self.clock()},
                          separators=(",", ":")) + "\n"
        with self._lock:
            if self.written_bytes + len(line) > self.max_bytes:
                self.written_bytes = self.max_bytes
                self.skipped_lookups += 1
                return
            self.out.write(line)
            self.written_bytes += len(line)

    def close(self) -> None:
        """Flush and close the file."""
        with self._lock:
            self.out.close()


@dataclass(frozen=True)
class TraceRecord:
    """One lookup read back from a trace (``written``: blocks written, not looked up)."""

    blocks: list[str]
    ts: float | None
    written: bool = False


def read_trace(lines: IO[str], source: str = "trace") -> Iterator[TraceRecord]:
    """Parse a JSONL trace; a malformed line is a ConfigError naming its line number."""
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record: Any = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{source}:{number}: not JSON ({exc.msg}): each line must be "
                              '{"blocks": ["<hash>", ...], "ts": seconds}') from None
        written = isinstance(record, dict) and "blocks" not in record and "written" in record
        blocks = record.get("written" if written else "blocks") if isinstance(record, dict) \
            else None
        if not isinstance(blocks, list) or not all(isinstance(b, (str, int)) for b in blocks):
            raise ConfigError(f"{source}:{number}: \"blocks\" must be a list of block hashes "
                              '(strings), e.g. {"blocks": ["9f86d081"], "ts": 0.0}')
        ts = record.get("ts")
        yield TraceRecord([str(b) for b in blocks], float(ts) if isinstance(ts, (int, float))
                          else None, written)
