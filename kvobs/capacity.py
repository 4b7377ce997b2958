"""Capacity of each KV cache tier, and what that capacity means for requests.

A tier plays one of two roles (:data:`kvobs.tiers.ROLES`):

* ``primary``: every running request needs blocks there, so the tier bounds how many
  requests can run at once. The GPU tier always is; so is vLLM HiSparse's host pool,
  the primary store of the sparse-MLA KV (a page cannot be computed without a host
  block, so a full host pool makes new requests wait).
* ``cache``: the tier keeps reusable copies (prefixes onloaded to the GPU before use):
  the offloading connector's CPU cache, SGLang HiCache, LMCache, disk tiers. It bounds
  how much context can be *kept*, never how many requests run.

Tiers are never added into one figure: the maximum concurrency is the smallest of the
primary tiers' limits, and the plan names the tier that bounds it (as vLLM's "GPU + host
KV cache size" line takes the smaller of its two pools' limits).

Example:
    >>> from kvobs.presets import preset_layout
    >>> layout = preset_layout("llama-3-8b")
    >>> plan = CapacityPlan.from_bytes(layout, {"gpu": 16 * 2**30, "host": 64 * 2**30},
    ...                                request_tokens=32768)
    >>> plan.tier("gpu").tokens, round(plan.max_concurrency, 2)
    (131072, 4.0)
    >>> round(plan.requests_held("host"), 1), plan.bounded_by
    (16.0, 'gpu')
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kvobs.errors import ConfigError
from kvobs.layout import KVLayout
from kvobs.tiers import CACHE, GPU, PRIMARY, ROLES, default_role, tier_order, validate_tier_name

GIB = 2**30


@dataclass(frozen=True)
class TierCapacity:
    """Size of one tier in blocks, with the block's token count and byte size.

    ``role``: ``primary`` or ``cache`` (see :data:`kvobs.tiers.ROLES`; empty: the tier's
    :func:`~kvobs.tiers.default_role`).
    ``request_blocks``: blocks one request of the plan's length needs in a primary tier,
    where the engine says (vLLM sums them over its KV cache groups); 0: its tokens /
    ``block_tokens``.
    ``block_tokens`` 0: a block holds no whole number of tokens (one layer of a chunk, as
    LMCache's layerwise memory objects): the tier's tokens are unknown, and the plan's
    event and lines say so rather than print 0 (for a cache tier: a primary tier's
    concurrency needs its tokens or ``request_blocks``); ``block_bytes`` 0 likewise for
    bytes.
    """

    tier: str
    blocks: int
    block_tokens: int
    block_bytes: int
    role: str = ""
    request_blocks: int = 0

    def __post_init__(self) -> None:
        validate_tier_name(self.tier)
        for field in ("blocks", "block_tokens", "block_bytes", "request_blocks"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(
                    f"{self.tier} tier: {field} must be a non-negative integer, got {value!r}"
                )
        if not self.role:
            object.__setattr__(self, "role", default_role(self.tier))
        elif self.role not in ROLES:
            raise ConfigError(f"{self.tier} tier: role must be one of {', '.join(ROLES)}, "
                              f"got {self.role!r}")

    @property
    def tokens(self) -> int:
        """Tokens of KV data the tier can hold."""
        return self.blocks * self.block_tokens

    @property
    def bytes(self) -> int:
        """Bytes of KV data the tier can hold."""
        return self.blocks * self.block_bytes

    @property
    def tokens_text(self) -> str:
        """``"N tokens"``, or ``"tokens unknown"`` where a block holds no whole number of
        tokens (``block_tokens`` 0).

        Example:
            >>> TierCapacity("host", 24, 0, 4096).tokens_text
            'tokens unknown'
        """
        return f"{self.tokens:,} tokens" if self.block_tokens else "tokens unknown"


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
        cls, layout: KVLayout, blocks: Mapping[str, int], request_tokens: int = 8192,
        roles: Mapping[str, str] | None = None,
    ) -> CapacityPlan:
        """Plan from block counts per tier (what an engine reports after start-up);
        ``roles`` overrides a tier's default role (``{"host": "primary"}`` for an engine
        whose host pool is its primary store)."""
        return cls(layout.name, _tiers(layout, blocks.items(), roles or {}), request_tokens,
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
        tiers = tuple(TierCapacity(t.name, t.capacity_blocks, t.block_tokens, t.block_bytes,
                                   t.role, t.request_blocks)
                      for t in (rec.tier(name) for name in rec.tier_names))
        return cls(rec.model, tiers, request_tokens, bytes_per_token)

    @classmethod
    def from_bytes(
        cls, layout: KVLayout, sizes: Mapping[str, float], request_tokens: int = 8192,
        roles: Mapping[str, str] | None = None,
    ) -> CapacityPlan:
        """Plan from bytes per tier: each tier holds ``floor(bytes / block_bytes)`` blocks."""
        counts = {}
        for tier, size in sizes.items():
            if isinstance(size, bool) or not isinstance(size, (int, float)) or size < 0:
                raise ConfigError(
                    f"{tier} tier size must be a non-negative number of bytes, got {size!r}"
                )
            counts[tier] = int(size // layout.bytes_per_block)
        return cls.from_blocks(layout, counts, request_tokens, roles)

    def tier(self, name: str) -> TierCapacity:
        """The capacity of tier ``name``; ConfigError if the plan has no such tier."""
        for tier in self.tiers:
            if tier.tier == name:
                return tier
        raise ConfigError(
            f"tier {name!r} is not in this plan (tiers: {[t.tier for t in self.tiers]})"
        )

    def concurrency(self, name: str) -> float:
        """Requests of ``request_tokens`` whose KV tier ``name`` can hold at once."""
        tier = self.tier(name)
        if tier.request_blocks:
            return tier.blocks / tier.request_blocks
        return tier.tokens / self.request_tokens

    @property
    def primary_tiers(self) -> tuple[TierCapacity, ...]:
        """The tiers every running request needs blocks in."""
        return tuple(t for t in self.tiers if t.role == PRIMARY)

    @property
    def bounded_by(self) -> str | None:
        """The primary tier with the smallest concurrency limit (None without one)."""
        primary = self.primary_tiers
        return min(primary, key=lambda t: self.concurrency(t.tier)).tier if primary else None

    @property
    def max_concurrency(self) -> float:
        """Requests of ``request_tokens`` that can run at once: the smallest limit of the
        primary tiers (0 without one)."""
        bound = self.bounded_by
        return self.concurrency(bound) if bound else 0.0

    def requests_held(self, name: str) -> float:
        """How many ``request_tokens``-long prefixes tier ``name`` can keep for reuse."""
        return self.tier(name).tokens / self.request_tokens

    def as_event(self) -> dict[str, Any]:
        """The fields of the ``kv_cache_capacity`` log event."""
        return {
            "model": self.model,
            "bytes_per_token": self.bytes_per_token or None,
            "request_tokens": self.request_tokens,
            # None where no tier bounds running requests (none read): never a made-up 0
            "max_concurrency": round(self.max_concurrency, 2) if self.bounded_by else None,
            "bounded_by": self.bounded_by,
            "tiers": {  # tokens / bytes None: not known (never a made-up 0)
                t.tier: {
                    "role": t.role,
                    "blocks": t.blocks,
                    "block_tokens": t.block_tokens or None,
                    "block_bytes": t.block_bytes or None,
                    "tokens": t.tokens if t.block_tokens else None,
                    "bytes": t.bytes if t.block_bytes else None,
                    "gib": round(t.bytes / GIB, 2) if t.block_bytes else None,
                    "requests_held": round(self.requests_held(t.tier), 1)
                    if t.block_tokens else None,
                    **({"max_concurrency": round(self.concurrency(t.tier), 2)}
                       if t.role == PRIMARY else {}),
                }
                for t in self.tiers
            },
        }

    def describe(self) -> list[str]:
        """Human-readable lines: one per tier, then what each tier means for requests."""
        lines = [
            f"{t.tier.upper():>5} KV cache: {t.blocks:,} blocks = {t.tokens_text} = "
            f"{t.bytes / GIB:,.2f} GiB"
            for t in self.tiers
        ]
        if self.bounded_by is not None:
            lines.append(
                f"Maximum concurrency for {self.request_tokens:,} tokens per request: "
                f"{self.max_concurrency:.2f}x ({self.bound_phrase()})"
            )
        for t in self.tiers:
            if t.role == PRIMARY and t.tier != GPU:
                lines.append(
                    f"{t.tier} pool is a primary store: every running request needs blocks "
                    f"there ({self.concurrency(t.tier):,.2f}x requests of "
                    f"{self.request_tokens:,} tokens; a full {t.tier} pool makes new "
                    "requests wait)")
            elif t.role == CACHE and not t.block_tokens:
                lines.append(
                    f"{t.tier} pool holds {t.blocks:,} blocks (tokens unknown: a block holds "
                    "no whole number of tokens) of reusable context, onloaded to the GPU "
                    "before use"
                )
            elif t.role == CACHE:
                lines.append(
                    f"{t.tier} pool holds {t.blocks:,} blocks = {t.tokens:,} tokens = prefixes "
                    f"of {self.requests_held(t.tier):,.1f} requests of {self.request_tokens:,} "
                    "tokens (reusable context, onloaded to the GPU before use)"
                )
        return lines

    def bound_phrase(self) -> str:
        """Which tier bounds the concurrency, with every primary tier's own limit when
        there are several: "bounded by the GPU tier" or "bounded by the host tier;
        gpu 9.31x, host 1.75x"."""
        bound = self.bounded_by
        text = f"bounded by the {bound.upper() if bound == GPU else bound} tier"
        primary = self.primary_tiers
        if len(primary) > 1:
            text += "; " + ", ".join(f"{t.tier} {self.concurrency(t.tier):.2f}x"
                                     for t in primary)
        return text


def _tiers(layout: KVLayout, counts: Iterable[tuple[str, int]],
           roles: Mapping[str, str]) -> tuple[TierCapacity, ...]:
    return tuple(
        TierCapacity(validate_tier_name(tier), blocks, layout.block_tokens, layout.bytes_per_block,
                     roles.get(tier, ""))
        for tier, blocks in counts
    )
