"""Capacity semantics: per-tier blocks/tokens/bytes; GPU bounds concurrency, host holds context."""

import pytest
import structlog

from kvobs.capacity import GIB, CapacityPlan, TierCapacity
from kvobs.errors import ConfigError
from kvobs.presets import preset_layout
from kvobs.telemetry.logs import capacity_line, log_capacity

LLAMA = preset_layout("llama-3-8b")  # 2 MiB blocks of 16 tokens


def test_from_bytes_floors_to_whole_blocks():
    plan = CapacityPlan.from_bytes(LLAMA, {"gpu": 16 * GIB + 2**20, "host": 120 * GIB})
    gpu, host = plan.tier("gpu"), plan.tier("host")
    assert (gpu.blocks, gpu.tokens, gpu.bytes) == (8192, 131072, 16 * GIB)
    assert (host.blocks, host.tokens, host.bytes) == (61440, 983040, 120 * GIB)


def test_concurrency_counts_the_gpu_tier_only():
    plan = CapacityPlan.from_blocks(LLAMA, {"gpu": 8192, "host": 61440}, request_tokens=32768)
    assert plan.max_concurrency == 4.0
    assert plan.requests_held("host") == 30.0
    event = plan.as_event()
    assert event["max_concurrency"] == 4.0  # not (8192 + 61440) * 16 / 32768 = 34
    assert event["tiers"]["host"]["requests_held"] == 30.0


def test_tiers_are_listed_fastest_first():
    plan = CapacityPlan.from_blocks(LLAMA, {"disk": 10, "host": 5, "gpu": 1})
    assert [t.tier for t in plan.tiers] == ["gpu", "host", "disk"]


def test_capacity_log_reports_every_tier_and_never_sums_them():
    plan = CapacityPlan.from_blocks(LLAMA, {"gpu": 8192, "host": 61728}, request_tokens=32768)
    with structlog.testing.capture_logs() as logs:
        log_capacity(plan, structlog.get_logger("kvobs"))
    event = next(e for e in logs if e["event"] == "kv_cache_capacity")
    assert event["tiers"]["host"] == {
        "role": "cache",
        "blocks": 61728,
        "block_tokens": 16,
        "block_bytes": 2**21,
        "tokens": 987648,
        "bytes": 61728 * 2**21,
        "gib": round(61728 * 2**21 / GIB, 2),
        "requests_held": 30.1,
    }
    assert event["tiers"]["gpu"]["blocks"] == 8192
    line = capacity_line(plan)
    assert "host 61,728 blocks = 987,648 tokens = 120.56 GiB" in line
    assert "max concurrency 4.00x" in line and "bounded by the GPU tier" in line
    assert "prefixes of 30.1" in line
    human = next(e for e in logs if e["event"] == line)
    assert human["log_level"] == "info"


def test_describe_has_a_host_line():
    plan = CapacityPlan.from_blocks(LLAMA, {"gpu": 10, "host": 20}, request_tokens=160)
    lines = plan.describe()
    assert any(line.startswith(" HOST KV cache: 20 blocks = 320 tokens") for line in lines)
    assert any("host pool holds 20 blocks = 320 tokens = prefixes of 2.0" in line for line in lines)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: CapacityPlan.from_blocks(LLAMA, {"gpu": -1}), "blocks must be a non-negative"),
        (lambda: CapacityPlan.from_bytes(LLAMA, {"host": -5.0}), "host tier size must be"),
        (lambda: CapacityPlan.from_blocks(LLAMA, {"GPU!": 1}), "tier name 'GPU!' is invalid"),
        (lambda: CapacityPlan.from_blocks(LLAMA, {"gpu": 1}, request_tokens=0), "request_tokens"),
        (lambda: CapacityPlan.from_blocks(LLAMA, {"gpu": 1}).tier("disk"), "not in this plan"),
        (lambda: TierCapacity("gpu", 1, 16, -1), "block_bytes"),
    ],
)
def test_bad_capacity_input(call, message):
    with pytest.raises(ConfigError, match=message):
        call()


def test_a_primary_host_pool_bounds_concurrency_when_it_is_the_smaller_limit():
    """vLLM HiSparse: the host pool is the primary store; the concurrency is the smaller
    of the two pools' limits (vLLM's "GPU + host KV cache size"), never their sum."""
    plan = CapacityPlan.from_blocks(LLAMA, {"gpu": 8192, "host": 4096}, request_tokens=32768,
                                    roles={"host": "primary"})
    assert plan.tier("host").role == "primary" and plan.bounded_by == "host"
    assert plan.max_concurrency == 4096 * 16 / 32768 == 2.0
    assert plan.concurrency("gpu") == 4.0
    line = capacity_line(plan)
    assert "max concurrency 2.00x" in line and "bounded by the host tier; gpu 4.00x, host 2.00x" \
        in line and "primary store" in line and "keeps prefixes" not in line
    bigger = CapacityPlan.from_blocks(LLAMA, {"gpu": 8192, "host": 61728}, request_tokens=32768,
                                      roles={"host": "primary"})
    assert bigger.bounded_by == "gpu" and bigger.max_concurrency == 4.0


def test_engine_block_counts_per_request_win_over_tokens():
    """Where the engine says how many blocks a request needs in a tier (vLLM sums them
    over its KV cache groups), the concurrency uses that."""
    plan = CapacityPlan("m", (TierCapacity("gpu", 149, 64, 1024, request_blocks=50),
                              TierCapacity("host", 28, 64, 4096, "primary", 16)), 1024)
    assert (plan.concurrency("gpu"), plan.concurrency("host")) == (149 / 50, 28 / 16)
    with pytest.raises(ConfigError, match="role must be one of primary, cache"):
        TierCapacity("host", 1, 1, 1, role="store")


def test_a_cache_tier_whose_blocks_hold_no_whole_tokens_has_its_tokens_left_out():
    """``block_tokens`` 0 (LMCache's layerwise objects where a chunk's tokens do not split
    evenly over the layers): tokens unknown, never a made-up 0, in the event, the lines
    and the metric series; blocks and bytes stay."""
    from kvobs.recorder import Recorder
    from kvobs.telemetry.series import snapshot_series

    plan = CapacityPlan("m", (TierCapacity("gpu", 10, 16, 1024),
                              TierCapacity("host", 24, 0, 4096)), 64)
    host = plan.as_event()["tiers"]["host"]
    assert (host["blocks"], host["bytes"]) == (24, 24 * 4096)
    assert (host["block_tokens"], host["tokens"], host["requests_held"]) == (None, None, None)
    assert plan.as_event()["tiers"]["gpu"]["tokens"] == 160
    line = capacity_line(plan)
    assert "host 24 blocks = tokens unknown = 96.0 KiB" in line
    assert "host pool keeps prefixes (tokens unknown)" in line
    lines = plan.describe()
    assert lines[1].startswith(" HOST KV cache: 24 blocks = tokens unknown = ")
    assert any("host pool holds 24 blocks (tokens unknown" in x for x in lines)
    rec = Recorder()
    rec.add_tier("host", capacity_blocks=24, block_tokens=0, block_bytes=4096)
    series = snapshot_series(rec.snapshot())
    assert "kvobs_tier_capacity_tokens" not in series
    assert series["kvobs_tier_capacity_bytes"] == [({"tier": "host"}, 24 * 4096)]


def test_a_tier_kvobs_cannot_read_is_named_unreadable_never_a_zero_concurrency():
    """The GPU tier unread (an engine release whose pool changed shape): the line says so
    in words and the event gives no concurrency at all, never "max concurrency 0.00x"."""
    plan = CapacityPlan.from_blocks(LLAMA, {"host": 64}, request_tokens=1024)
    why = "unreadable on vLLM 0.35.0: BlockPool.null_block.block_hash is missing"
    line = capacity_line(plan, {"gpu": why})
    assert line.startswith("KV cache capacity (llama-3-8b, 131,072 B/token): host 64 blocks")
    assert f"gpu tier {why}" in line and "max concurrency" not in line
    assert plan.as_event()["max_concurrency"] is None and plan.as_event()["bounded_by"] is None
