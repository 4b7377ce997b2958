"""The capacity event: every tier's capacity and what it means, as one
``kv_cache_capacity`` event and one human-readable line.

kvobs's loggers and the CLI's structlog set-up are the core's (:mod:`kvobs.logs`); this
module writes the capacity event through whichever logger it is given.

Example:
    >>> import structlog
    >>> from kvobs.presets import preset_layout
    >>> plan = CapacityPlan.from_blocks(preset_layout("llama-3-8b"), {"gpu": 100, "host": 400})
    >>> with structlog.testing.capture_logs() as logs:
    ...     log_capacity(plan, structlog.get_logger("kvobs"))
    >>> logs[0]["event"], logs[0]["tiers"]["host"]["blocks"]
    ('kv_cache_capacity', 400)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvobs.capacity import GIB, CapacityPlan
from kvobs.tiers import CACHE, GPU


def capacity_line(plan: CapacityPlan, unreadable: Mapping[str, str] | None = None) -> str:
    """The capacity of every tier and what it means, on one human-readable line;
    ``unreadable`` names each tier kvobs could not read and why (``{"gpu": "unreadable on
    vLLM 0.35.0: ..."}``), in words, where the line would otherwise leave it out.

    Example:
        >>> from kvobs.capacity import TierCapacity
        >>> plan = CapacityPlan("tiny", (TierCapacity("gpu", 23, 32, 32768),
        ...                              TierCapacity("host", 24, 32, 0)), 224, 1024)
        >>> for part in capacity_line(plan).split("; ")[:2]:
        ...     print(part)
        KV cache capacity (tiny, 1,024 B/token): gpu 23 blocks = 736 tokens = 736.0 KiB
        host 24 blocks = 768 tokens (bytes unknown)
    """
    tiers = "; ".join(
        f"{t.tier} {t.blocks:,} blocks = {t.tokens_text} = {_size(t.bytes)}"
        if t.block_bytes else f"{t.tier} {t.blocks:,} blocks = {t.tokens_text} (bytes unknown)"
        for t in plan.tiers
    )
    missing = "; ".join(f"{tier} tier {why}" for tier, why in (unreadable or {}).items())
    tiers = "; ".join(text for text in (tiers, missing) if text)
    per_token = f", {plan.bytes_per_token:,} B/token" if plan.bytes_per_token else ""
    parts = [f"KV cache capacity ({plan.model}{per_token}): {tiers}"]
    if plan.bounded_by is not None:
        parts.append(
            f"max concurrency {plan.max_concurrency:.2f}x for {plan.request_tokens:,}-token "
            f"requests ({plan.bound_phrase()})"
        )
    parts += [
        (f"{t.tier} pool keeps prefixes of {plan.requests_held(t.tier):,.1f} such requests"
         if t.block_tokens else f"{t.tier} pool keeps prefixes (tokens unknown)")
        if t.role == CACHE else
        f"{t.tier} pool is a primary store (a full {t.tier} pool makes new requests wait)"
        for t in plan.tiers
        if t.tier != GPU
    ]
    return "; ".join(parts)


def _size(n: int) -> str:
    """Bytes in the largest binary unit that keeps the figure >= 1 (GiB at most)."""
    for unit, scale in (("GiB", GIB), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:,.2f} {unit}" if unit == "GiB" else f"{n / scale:,.1f} {unit}"
    return f"{n} B"


def log_capacity(plan: CapacityPlan, logger: Any) -> None:
    """Emit the ``kv_cache_capacity`` event and the human-readable capacity line."""
    logger.info("kv_cache_capacity", **plan.as_event())
    logger.info(capacity_line(plan))
