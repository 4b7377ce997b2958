"""What a capacity plan refuses, and the fix each error names
(:class:`kvobs.capacity.TierCapacity`, :class:`kvobs.capacity.CapacityPlan`)."""

from __future__ import annotations

from typing import Any

import pytest

from kvobs.capacity import CapacityPlan, TierCapacity
from kvobs.errors import ConfigError

GPU = TierCapacity("gpu", 10, 16, 1024)


@pytest.mark.parametrize("value", [True, False, 1.0, "4", -1, None])
@pytest.mark.parametrize("field", ["blocks", "block_tokens", "block_bytes", "request_blocks"])
def test_a_tier_count_must_be_a_non_negative_integer_not_a_bool(field: str, value: Any) -> None:
    sizes = {"blocks": 10, "block_tokens": 16, "block_bytes": 1024, "request_blocks": 0,
             field: value}
    with pytest.raises(ConfigError) as raised:
        TierCapacity("host", **sizes)
    assert str(raised.value) == (
        f"host tier: {field} must be a non-negative integer, got {value!r}")


@pytest.mark.parametrize("request_tokens", [True, 0, -8, 8.0, "8192", None])
def test_request_tokens_must_be_a_positive_integer(request_tokens: Any) -> None:
    with pytest.raises(ConfigError) as raised:
        CapacityPlan("m", (GPU,), request_tokens)
    assert str(raised.value) == (f"request_tokens must be a positive integer, got "
                                 f"{request_tokens!r}: pass --request-tokens N")


def test_one_token_requests_are_a_plan() -> None:
    assert CapacityPlan("m", (GPU,), 1).max_concurrency == 160.0


def test_a_tier_named_twice_is_refused_with_the_names() -> None:
    with pytest.raises(ConfigError) as raised:
        CapacityPlan("m", (GPU, TierCapacity("host", 1, 16, 1024), GPU), 8)
    assert str(raised.value) == "tiers must be unique, got ['gpu', 'host', 'gpu']"
