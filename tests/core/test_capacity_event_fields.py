"""The ``kv_cache_capacity`` event's fields word for word
(:meth:`kvobs.capacity.CapacityPlan.as_event`): every key, the roundings, and None (never
a made-up 0) where a tier's tokens or bytes, or the engine's bytes per token, are unknown."""

from __future__ import annotations

from kvobs.capacity import GIB, CapacityPlan, TierCapacity


def test_every_field_of_a_plan_with_known_and_unknown_sizes() -> None:
    plan = CapacityPlan("org/model", (TierCapacity("disk", 1000, 16, 0),
                                      TierCapacity("host", 24, 0, 3 * GIB // 24),
                                      TierCapacity("gpu", 10, 16, 1024)), 48, 64)
    assert plan.as_event() == {
        "model": "org/model",
        "bytes_per_token": 64,
        "request_tokens": 48,
        "max_concurrency": 3.33,  # 160 / 48
        "bounded_by": "gpu",
        "tiers": {
            "gpu": {"role": "primary", "blocks": 10, "block_tokens": 16, "block_bytes": 1024,
                    "tokens": 160, "bytes": 10240, "gib": 0.0, "requests_held": 3.3,
                    "max_concurrency": 3.33},
            "host": {"role": "cache", "blocks": 24, "block_tokens": None,
                     "block_bytes": 3 * GIB // 24, "tokens": None, "bytes": 3 * GIB,
                     "gib": 3.0, "requests_held": None},
            "disk": {"role": "cache", "blocks": 1000, "block_tokens": 16, "block_bytes": None,
                     "tokens": 16000, "bytes": None, "gib": None, "requests_held": 333.3},
        },
    }
    assert list(plan.as_event()["tiers"]) == ["gpu", "host", "disk"]


def test_an_engine_that_did_not_say_its_bytes_per_token_and_no_primary_tier() -> None:
    plan = CapacityPlan("m", (TierCapacity("host", 7, 16, 1 << 20),), 3)
    event = plan.as_event()
    assert (event["bytes_per_token"], event["max_concurrency"], event["bounded_by"]) == (
        None, None, None)
    assert event["tiers"]["host"]["gib"] == 0.01  # 7 MiB
    assert event["tiers"]["host"]["requests_held"] == 37.3  # 112 / 3
    assert "max_concurrency" not in event["tiers"]["host"]


def test_a_primary_host_pools_own_concurrency_is_in_its_tier() -> None:
    plan = CapacityPlan("m", (TierCapacity("gpu", 100, 16, 1024),
                              TierCapacity("host", 70, 16, 1024, role="primary")), 48)
    event = plan.as_event()
    assert (event["max_concurrency"], event["bounded_by"]) == (23.33, "host")  # 1120 / 48
    assert event["tiers"]["host"]["max_concurrency"] == 23.33
    assert event["tiers"]["gpu"]["max_concurrency"] == 33.33
