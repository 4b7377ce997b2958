"""A capacity plan from the tiers an engine adapter registered
(:meth:`kvobs.capacity.CapacityPlan.from_recorder`): the model, each tier's role and
blocks per request carried over, and the defaults (8,192-token requests, bytes per token
not said)."""

from __future__ import annotations

from kvobs.capacity import CapacityPlan
from kvobs.recorder import Recorder


def engine() -> Recorder:
    rec = Recorder(model="org/model")
    rec.add_tier("gpu", capacity_blocks=1000, block_tokens=16, block_bytes=4096)
    rec.add_tier("host", capacity_blocks=300, block_tokens=64, block_bytes=16384,
                 role="primary", request_blocks=40)
    return rec


def test_the_plan_keeps_the_model_roles_and_blocks_per_request() -> None:
    plan = CapacityPlan.from_recorder(engine(), request_tokens=1600, bytes_per_token=256)
    assert (plan.model, plan.request_tokens, plan.bytes_per_token) == ("org/model", 1600, 256)
    host = plan.tier("host")
    assert (host.role, host.request_blocks, host.blocks, host.block_tokens) == (
        "primary", 40, 300, 64)
    assert plan.concurrency("host") == 7.5  # 300 blocks / 40 a request, not its tokens
    assert (plan.bounded_by, plan.max_concurrency) == ("host", 7.5)
    assert plan.as_event()["bytes_per_token"] == 256


def test_by_default_requests_are_8192_tokens_and_bytes_per_token_unknown() -> None:
    plan = CapacityPlan.from_recorder(engine())
    assert (plan.request_tokens, plan.bytes_per_token) == (8192, 0)
    assert plan.as_event()["bytes_per_token"] is None
    assert plan.tier("gpu").role == "primary" and plan.tier("gpu").request_blocks == 0
    assert plan.concurrency("gpu") == 16000 / 8192
