"""The capacity plan's human lines word for word, and what :meth:`CapacityPlan.from_bytes`
accepts: each case is one a mutant of :mod:`kvobs.capacity` got past the older tests."""

from __future__ import annotations

import pytest

from kvobs.capacity import GIB, CapacityPlan, TierCapacity
from kvobs.errors import ConfigError
from kvobs.presets import preset_layout

LLAMA = preset_layout("llama-3-8b")  # 2 MiB blocks of 16 tokens


def test_a_primary_host_pool_has_its_own_line_after_the_bound() -> None:
    plan = CapacityPlan.from_blocks(LLAMA, {"gpu": 8192, "host": 4096}, request_tokens=32768,
                                    roles={"host": "primary"})
    assert plan.describe() == [
        "  GPU KV cache: 8,192 blocks = 131,072 tokens = 16.00 GiB",
        " HOST KV cache: 4,096 blocks = 65,536 tokens = 8.00 GiB",
        "Maximum concurrency for 32,768 tokens per request: 2.00x "
        "(bounded by the host tier; gpu 4.00x, host 2.00x)",
        "host pool is a primary store: every running request needs blocks there (2.00x "
        "requests of 32,768 tokens; a full host pool makes new requests wait)",
    ]


def test_cache_tiers_say_what_they_keep_with_or_without_whole_tokens() -> None:
    plan = CapacityPlan("m", (TierCapacity("gpu", 10, 16, 1024),
                              TierCapacity("host", 24, 0, 4096),
                              TierCapacity("disk", 1000, 16, 2**20)), 64)
    assert plan.describe() == [
        "  GPU KV cache: 10 blocks = 160 tokens = 0.00 GiB",
        " HOST KV cache: 24 blocks = tokens unknown = 0.00 GiB",
        " DISK KV cache: 1,000 blocks = 16,000 tokens = 0.98 GiB",
        "Maximum concurrency for 64 tokens per request: 2.50x (bounded by the GPU tier)",
        "host pool holds 24 blocks (tokens unknown: a block holds no whole number of tokens) "
        "of reusable context, onloaded to the GPU before use",
        "disk pool holds 1,000 blocks = 16,000 tokens = prefixes of 250.0 requests of 64 "
        "tokens (reusable context, onloaded to the GPU before use)",
    ]


def test_without_a_primary_tier_no_concurrency_line_is_written() -> None:
    plan = CapacityPlan("m", (TierCapacity("host", 24, 16, 4096),), 64)
    assert plan.describe() == [
        " HOST KV cache: 24 blocks = 384 tokens = 0.00 GiB",
        "host pool holds 24 blocks = 384 tokens = prefixes of 6.0 requests of 64 tokens "
        "(reusable context, onloaded to the GPU before use)",
    ]


def test_plans_from_blocks_or_bytes_default_to_8192_token_requests() -> None:
    assert CapacityPlan.from_blocks(LLAMA, {"gpu": 1}).request_tokens == 8192
    assert CapacityPlan.from_bytes(LLAMA, {"gpu": GIB}).request_tokens == 8192


def test_from_bytes_keeps_the_roles_it_is_given() -> None:
    plan = CapacityPlan.from_bytes(LLAMA, {"gpu": 16 * GIB, "host": 8 * GIB},
                                   request_tokens=32768, roles={"host": "primary"})
    assert plan.tier("host").role == "primary" and plan.bounded_by == "host"


def test_from_bytes_takes_an_empty_tier_and_counts_huge_ones_exactly() -> None:
    """0 bytes is a tier of 0 blocks (not an error); the block count is the integer floor,
    exact past float precision (2**53 + 1 blocks, not 2**53)."""
    plan = CapacityPlan.from_bytes(LLAMA, {"gpu": 0, "host": 0.5})
    assert (plan.tier("gpu").blocks, plan.tier("host").blocks) == (0, 0)
    blocks = 2**53 + 1
    huge = CapacityPlan.from_bytes(LLAMA, {"disk": blocks * LLAMA.bytes_per_block + 1})
    assert huge.tier("disk").blocks == blocks


@pytest.mark.parametrize("size", [True, "1 GiB", None])
def test_from_bytes_refuses_a_size_that_is_not_a_number_of_bytes(size: object) -> None:
    with pytest.raises(ConfigError, match="host tier size must be a non-negative number"):
        CapacityPlan.from_bytes(LLAMA, {"host": size})  # type: ignore[dict-item]
