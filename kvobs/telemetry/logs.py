"""structlog set-up and the two events kvobs logs: capacity at start, a periodic summary.

Nothing is logged per block: the hot path only counts. JSON lines when stderr is not a
terminal (log shippers), coloured key=value lines on a terminal.

Example:
    >>> import structlog
    >>> from kvobs.capacity import CapacityPlan
    >>> from kvobs.presets import preset_layout
    >>> plan = CapacityPlan.from_blocks(preset_layout("llama-3-8b"), {"gpu": 100, "host": 400})
    >>> with structlog.testing.capture_logs() as logs:
    ...     log_capacity(plan, structlog.get_logger("kvobs"))
    >>> logs[0]["event"], logs[0]["tiers"]["host"]["blocks"]
    ('kv_cache_capacity', 400)
"""

from __future__ import annotations

import logging
import sys
from typing import Any, Literal, TextIO

import structlog

from kvobs.capacity import GIB, CapacityPlan
from kvobs.errors import ConfigError
from kvobs.tiers import CACHE, GPU

LogFormat = Literal["auto", "json", "console"]
_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}


def configure_logging(fmt: str = "auto", level: str = "info", stream: TextIO | None = None) -> None:
    """Configure structlog process-wide (call once, from the CLI or the engine plugin)."""
    if fmt not in ("auto", "json", "console"):
        raise ConfigError(f"--log-format {fmt!r} is invalid: use auto, json or console")
    if level not in _LEVELS:
        raise ConfigError(f"--log-level {level!r} is invalid: use {', '.join(_LEVELS)}")
    out = stream or sys.stderr
    console = fmt == "console" or (fmt == "auto" and out.isatty())
    renderer: Any = (
        structlog.dev.ConsoleRenderer() if console else structlog.processors.JSONRenderer()
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]),
        logger_factory=structlog.PrintLoggerFactory(out),
        cache_logger_on_first_use=True,
    )


def capacity_line(plan: CapacityPlan) -> str:
    """The capacity of every tier and what it means, on one human-readable line.

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
        f"{t.tier} {t.blocks:,} blocks = {t.tokens:,} tokens = {_size(t.bytes)}"
        if t.block_bytes else f"{t.tier} {t.blocks:,} blocks = {t.tokens:,} tokens (bytes unknown)"
        for t in plan.tiers
    )
    per_token = f", {plan.bytes_per_token:,} B/token" if plan.bytes_per_token else ""
    parts = [f"KV cache capacity ({plan.model}{per_token}): {tiers}"]
    if plan.bounded_by is not None:
        parts.append(
            f"max concurrency {plan.max_concurrency:.2f}x for {plan.request_tokens:,}-token "
            f"requests ({plan.bound_phrase()})"
        )
    parts += [
        f"{t.tier} pool keeps prefixes of {plan.requests_held(t.tier):,.1f} such requests"
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
