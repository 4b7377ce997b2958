"""Registering and resizing tiers: bad sizes are ConfigErrors that name the tier and the
field, registering a tier again keeps its counters and takes the new sizes, a tier
recorder built alone has its name's role and no request size, the unknown-tier error
lists what is registered, and occupancy read from the engine is clamped to the capacity."""

from __future__ import annotations

import re

import pytest

from kvobs.errors import ConfigError, UnknownTierError
from kvobs.recorder import Recorder, TierRecorder


def _error(tier: str, field: str, value: object) -> str:
    return f"^{re.escape(f'{tier} tier: {field} must be a non-negative integer, got {value!r}')}$"


@pytest.mark.parametrize("field", ["capacity_blocks", "block_tokens", "block_bytes",
                                   "request_blocks"])
@pytest.mark.parametrize("value", [-1, True, 2.5, "16"])
def test_a_bad_tier_size_is_a_config_error_naming_the_tier_and_the_field(
        field: str, value: object) -> None:
    sizes: dict[str, object] = {"capacity_blocks": 8, "block_tokens": 16, "block_bytes": 1024,
                                "request_blocks": 0, field: value}
    rec = Recorder()
    with pytest.raises(ConfigError, match=_error("host", field, value)):
        rec.add_tier("host", **sizes)  # type: ignore[arg-type]
    assert rec.tier_names == ()


def test_an_unknown_role_is_a_config_error_listing_the_roles() -> None:
    with pytest.raises(ConfigError) as raised:
        Recorder().add_tier("host", 8, 16, 1024, role="backup")
    assert str(raised.value) == "tier 'host': role must be one of primary, cache, got 'backup'"


def test_registering_a_tier_again_keeps_its_counters_and_takes_the_new_sizes() -> None:
    rec = Recorder()
    gpu = rec.add_tier("gpu", 8, block_tokens=16, block_bytes=1024)
    gpu.allocate(3)
    again = rec.add_tier("gpu", 32, block_tokens=32, block_bytes=4096, request_blocks=2)
    assert again is gpu
    t = rec.snapshot().tier("gpu")
    assert (t.capacity_blocks, t.block_tokens, t.block_bytes) == (32, 32, 4096)
    assert (t.allocations, t.in_use_blocks, t.free_blocks) == (3, 3, 29)
    assert (gpu.role, gpu.request_blocks) == ("primary", 2)


def test_set_capacity_resizes_the_tier_that_the_snapshot_reads() -> None:
    rec = Recorder()
    gpu = rec.add_tier("gpu", 8, block_tokens=16, block_bytes=1024)
    gpu.allocate(6)
    gpu.set_capacity(20)
    t = rec.snapshot().tier("gpu")
    assert (t.capacity_blocks, t.in_use_blocks, t.free_blocks) == (20, 6, 14)


@pytest.mark.parametrize("value", [-1, True, 2.5, None])
def test_set_capacity_refuses_a_bad_size_naming_the_tier_and_keeps_the_old_one(
        value: object) -> None:
    rec = Recorder()
    host = rec.add_tier("host", 8, block_tokens=16, block_bytes=1024)
    with pytest.raises(ConfigError, match=_error("host", "capacity_blocks", value)):
        host.set_capacity(value)  # type: ignore[arg-type]
    assert rec.snapshot().tier("host").capacity_blocks == 8


def test_set_capacity_takes_zero() -> None:
    rec = Recorder()
    host = rec.add_tier("host", 8, block_tokens=16, block_bytes=1024)
    host.set_capacity(0)
    assert rec.snapshot().tier("host").capacity_blocks == 0


@pytest.mark.parametrize("name,role", [("gpu", "primary"), ("host", "cache"), ("disk", "cache")])
def test_a_tier_recorder_built_alone_has_its_names_role_and_no_request_size(
        name: str, role: str) -> None:
    tier = TierRecorder(name, 8, 16, 1024)
    assert (tier.role, tier.request_blocks) == (role, 0)


def test_the_unknown_tier_error_lists_the_registered_tiers() -> None:
    rec = Recorder()
    with pytest.raises(UnknownTierError) as raised:
        rec.tier("host")
    assert str(raised.value) == ("tier 'host' is not registered: call add_tier('host', ...) "
                                 "first (registered: none)")
    rec.add_tier("gpu", 8, 16, 1024)
    rec.add_tier("disk", 8, 16, 1024)
    with pytest.raises(UnknownTierError) as raised:
        rec.tier("host")
    assert str(raised.value).endswith("(registered: gpu, disk)")


def test_engine_occupancy_beyond_the_capacity_reads_as_a_full_tier() -> None:
    rec = Recorder()
    gpu = rec.add_tier("gpu", 10, block_tokens=16, block_bytes=1024)
    gpu.set_resident(6, 6)  # read between two engine updates
    t = rec.snapshot().tier("gpu")
    assert (t.in_use_blocks, t.cached_blocks, t.free_blocks) == (6, 4, 0)


def test_the_engine_and_model_labels_default_to_unknown() -> None:
    snap = Recorder().snapshot()
    assert (snap.engine, snap.model) == ("unknown", "unknown")
    named = Recorder(engine="vllm", model="llama-3-8b").snapshot()
    assert (named.engine, named.model) == ("vllm", "llama-3-8b")
