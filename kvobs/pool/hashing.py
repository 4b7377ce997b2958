"""Prefix block hashes: block ``i``'s hash covers its tokens and every block before it.

Like vLLM's prefix caching, two prompts share block ``i`` only if they agree on all
tokens up to the end of that block. Prompts are sequences of segments (a system prompt,
a user message, an answer) instead of token ids; only full blocks get a hash.

Example:
    >>> a = block_hashes([("sys", 1, 40), ("turn", 7, 10)], block_tokens=16)
    >>> b = block_hashes([("sys", 1, 40), ("turn", 8, 30)], block_tokens=16)
    >>> len(a), len(b), a[:2] == b[:2], a[2] == b[2]
    (3, 4, True, False)
"""

from __future__ import annotations

from collections.abc import Iterable

Segment = tuple[str, int, int]


def block_hashes(segments: Iterable[Segment], block_tokens: int) -> list[int]:
    """Hashes of the full blocks of the token stream made of ``segments``."""
    hashes: list[int] = []
    previous = 0
    pieces: list[tuple[str, int, int, int]] = []
    filled = 0
    for kind, seg_id, tokens in segments:
        offset = 0
        while offset < tokens:
            take = min(block_tokens - filled, tokens - offset)
            pieces.append((kind, seg_id, offset, offset + take))
            offset += take
            filled += take
            if filled == block_tokens:
                previous = hash((previous, tuple(pieces)))
                hashes.append(previous)
                pieces.clear()
                filled = 0
    return hashes
