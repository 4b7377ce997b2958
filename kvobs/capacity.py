"""Capacity of each KV cache tier, and what that capacity means for requests.

The GPU tier bounds how many requests can *run* at once; the host (and disk) tier bounds
how much reusable context can be *kept*. The two are never added into one concurrency
figure: a request cannot run from host memory, its KV must be onloaded first.

Example:
    >>> from kvobs.presets import preset_layout
    >>> layout = preset_layout("llama-3-8b")
    >>> plan = CapacityPlan.from_bytes(layout, {"gpu": 16 * 2**30, "host": 64 * 2**30},
    ...                                request_tokens=32768)
    >>> plan.tier("gpu").tokens, round(plan.max_concurrency, 2)
    (131072, 4.0)
    >>> round(plan.requests_held("host"), 1)
    16.0
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kvobs.errors import ConfigError
from kvobs.layout import KVLayout
from kvobs.tiers import GPU, tier_order, validate_tier_name

GIB = 2**30


@dataclass(frozen=True)
class TierCapacity:
    """Size of one tier in blocks, with the block's token count and byte size."""

    tier: str
    blocks: int
    block_tokens: int
    block_bytes: int

    def __post_init__(self) -> None:
        validate_tier_name(self.tier)
        for field in ("blocks", "block_tokens", "block_bytes"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(
                    f"{self.tier} tier: {field} must be a non-negative integer, got {value!r}"
                )

    @property
    def tokens(self) -> int:
        """Tokens of KV data the tier can hold."""
        return self.blocks * self.block_tokens

    @property
    def bytes(self) -> int:
        """Bytes of KV data the tier can hold."""
        return self.blocks * self.block_bytes


@dataclass(frozen=True)
class CapacityPlan:
    """All tiers of one engine plus the request length used to interpret them.

    This is the one shape of the ``kv_cache_capacity`` event, whoever logs it: the demo
    and ``kvobs capacity`` build it from a :class:`~kvobs.layout.KVLayout`
    (:meth:`from_blocks`, :meth:`from_bytes`), engine adapters from the tiers they
    registered (:meth:`from_recorder`), where each tier keeps its own block size (a vLLM
    host chunk holds several GPU blocks).
    """

    model: str
    tiers: tuple[TierCapacity, ...]
    request_tokens: int = 8192
    bytes_per_token: int = 0  # 0: the engine did not say

    def __post_init__(self) -> None:
        if (
            isinstance(self.request_tokens, bool)
            or not isinstance(self.request_tokens, int)
            or self.request_tokens <= 0
        ):
            raise ConfigError(
                f"request_tokens must be a positive integer, got {self.request_tokens!r}: "
                "pass --request-tokens N"
            )
        names = [t.tier for t in self.tiers]
        if len(set(names)) != len(names):
            raise ConfigError(f"tiers must be unique, got {names}")
        object.__setattr__(
            self, "tiers", tuple(sorted(self.tiers, key=lambda t: tier_order(t.tier)))
        )

    @classmethod
    def from_blocks(
        cls, layout: KVLayout, blocks: Mapping[str, int], request_tokens: int = 8192
    ) -> CapacityPlan:
        """Plan from block counts per tier (what an engine reports after start-up)."""
        return cls(layout.name, _tiers(layout, blocks.items()), request_tokens,
                   layout.bytes_per_token)

    @classmethod
    def from_recorder(cls, rec: Any, request_tokens: int = 8192,
                      bytes_per_token: int = 0) -> CapacityPlan:
        """Plan from the tiers an adapter registered on a :class:`~kvobs.recorder.Recorder`.

        Example:
            >>> from kvobs.recorder import Recorder
            >>> rec = Recorder(model="tiny")
            >>> _ = rec.add_tier("gpu", capacity_blocks=100, block_tokens=16, block_bytes=4096)
            >>> _ = rec.add_tier("host", capacity_blocks=50, block_tokens=64, block_bytes=16384)
            >>> plan = CapacityPlan.from_recorder(rec, request_tokens=800)
            >>> plan.max_concurrency, plan.requests_held("host")
            (2.0, 4.0)
        """
        tiers = tuple(TierCapacity(t.name, t.capacity_blocks, t.block_tokens, t.block_bytes)
                      for t in (rec.tier(name) for name in rec.tier_names))
        return cls(rec.model, tiers, request_tokens, bytes_per_token)

    @classmethod
    def from_bytes(
        cls, layout: KVLayout, sizes: Mapping[str, float], request_tokens: int = 8192
    ) -> CapacityPlan:
        """Plan from bytes per tier: each tier holds ``floor(bytes / block_bytes)`` blocks."""
        counts = {}
        for tier, size in sizes.items():
            if isinstance(size, bool) or not isinstance(size, (int, float)) or size < 0:
                raise ConfigError(
                    f"{tier} tier size must be a non-negative number of bytes, got {size!r}"
                )
            counts[tier] = int(size // layout.bytes_per_block)
        return cls.from_blocks(layout, counts, request_tokens)

    def tier(self, name: str) -> TierCapacity:
        """The capacity of tier ``name``; ConfigError if the plan has no such tier."""
        for tier in self.tiers:
            if tier.tier == name:
                return tier
        raise ConfigError(
            f"tier {name!r} is not in this plan (tiers: {[t.tier for t in self.tiers]})"
        )

    @property
    def max_concurrency(self) -> float:
        """Requests of ``request_tokens`` that fit in the GPU tier at once (0 without one)."""
        names = [t.tier for t in self.tiers]
        return self.tier(GPU).tokens / self.request_tokens if GPU in names else 0.0

    def requests_held(self, name: str) -> float:
        """How many ``request_tokens``-long prefixes tier ``name`` can keep for reuse."""
        return self.tier(name).tokens / self.request_tokens

    def as_event(self) -> dict[str, Any]:
        """The fields of the ``kv_cache_capacity`` log event."""
        return {
            "model": self.model,
            "bytes_per_token": self.bytes_per_token or None,
            "request_tokens": self.request_tokens,
            "max_concurrency": round(self.max_concurrency, 2),
            "tiers": {  # bytes None: the engine did not say (never a made-up 0)
                t.tier: {
                    "blocks": t.blocks,
                    "block_tokens": t.block_tokens,
                    "block_bytes": t.block_bytes or None,
                    "tokens": t.tokens,
                    "bytes": t.bytes if t.block_bytes else None,
                    "gib": round(t.bytes / GIB, 2) if t.block_bytes else None,
                    "requests_held": round(self.requests_held(t.tier), 1),
                }
                for t in self.tiers
            },
        }

    def describe(self) -> list[str]:
        """Human-readable lines: one per tier, then what each tier means for requests."""
        lines = [
            f"{t.tier.upper():>5} KV cache: {t.blocks:,} blocks = {t.tokens:,} tokens = "
            f"{t.bytes / GIB:,.2f} GiB"
            for t in self.tiers
        ]
        names = [t.tier for t in self.tiers]
        if GPU in names:
            lines.append(
                f"Maximum concurrency for {self.request_tokens:,} tokens per request: "
                f"{self.max_concurrency:.2f}x (bounded by the GPU tier)"
            )
        for t in self.tiers:
            if t.tier != GPU:
                lines.append(
                    f"{t.tier} pool holds {t.blocks:,} blocks = {t.tokens:,} tokens = prefixes "
                    f"of {self.requests_held(t.tier):,.1f} requests of {self.request_tokens:,} "
                    "tokens (reusable context, onloaded to the GPU before use)"
                )
        return lines


def _tiers(layout: KVLayout, counts: Iterable[tuple[str, int]]) -> tuple[TierCapacity, ...]:
    return tuple(
        TierCapacity(validate_tier_name(tier), blocks, layout.block_tokens, layout.bytes_per_block)
        for tier, blocks in counts
    )
