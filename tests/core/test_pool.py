"""The reference tiered pool: recorder agrees with the pool's own state; bytes really move."""

import torch

from kvobs.pool import ServingLoop, TieredKVPool
from kvobs.pool.workload import ChatWorkload, WorkloadConfig
from kvobs.presets import preset_layout
from kvobs.recorder import Recorder

LAYOUT = preset_layout("qwen2.5-0.5b")


def run_demo_workload(seed=3, seconds=60.0, gpu=256, host=1024):
    rec = Recorder()
    pool = TieredKVPool(LAYOUT, gpu, host, rec, device="cpu")
    loop = ServingLoop(pool, ChatWorkload(WorkloadConfig(rate=1.0), seed=seed))
    checks = []

    def check():
        snap = rec.snapshot()
        for tier, (in_use, cached) in pool.occupancy().items():
            t = snap.tier(tier)
            checks.append((t.in_use_blocks, t.cached_blocks) == (in_use, cached))
            assert t.free_blocks >= 0 and t.resident_blocks <= t.capacity_blocks

    loop.run(seconds, pace=False, on_tick=check)
    return rec, pool, loop, checks


def test_recorder_matches_pool_state_at_every_tick():
    rec, _, loop, checks = run_demo_workload()
    assert checks and all(checks)
    snap = rec.snapshot()
    outcomes = snap.lookups.outcomes()
    assert outcomes["gpu_hit"] > 0 and outcomes["host_hit"] > 0 and outcomes["miss"] > 0
    assert snap.link("gpu", "host").blocks > 0 and snap.link("host", "gpu").blocks > 0
    assert snap.tier("host").evictions_total > 0
    assert snap.thrash.offloaded_reused > 0
    assert loop.stats.completed > 0


def test_host_hits_equal_onloaded_blocks():
    rec, pool, _, _ = run_demo_workload()
    snap = rec.snapshot()
    assert snap.lookups.host_hit == snap.link("host", "gpu").blocks * pool.block_tokens
    bytes_per_block = LAYOUT.bytes_per_block
    assert snap.link("host", "gpu").bytes == snap.link("host", "gpu").blocks * bytes_per_block


def test_same_seed_same_run():
    first, second = (
        run_demo_workload(seed=11)[0].snapshot(),
        run_demo_workload(seed=11)[0].snapshot(),
    )
    assert first.lookups == second.lookups
    assert first.tiers == second.tiers
    assert first.thrash == second.thrash
    assert run_demo_workload(seed=12)[0].snapshot().lookups != first.lookups


def test_offload_then_onload_round_trips_the_bytes():
    rec = Recorder()
    pool = TieredKVPool(LAYOUT, gpu_blocks=4, host_blocks=8, recorder=rec, device="cpu")
    system = [("sys", 0, 64)]  # exactly 4 blocks
    first = pool.admit(system, output_tokens=0)
    payload = torch.randn(4, pool.gpu.shape[1]).to(pool.gpu.dtype)
    pool.gpu[first.blocks] = payload
    pool.release(first, system)
    other = pool.admit([("sys", 1, 64)], output_tokens=0)  # evicts all 4: offloaded to host
    assert rec.snapshot().link("gpu", "host").blocks == 4
    pool.release(other, [("sys", 1, 64)])
    again = pool.admit(system, output_tokens=0)  # host hit: onloaded into fresh GPU blocks
    assert (again.gpu_hit_blocks, again.host_hit_blocks) == (0, 4)
    assert torch.equal(pool.gpu[again.blocks], payload)


def test_no_host_tier_means_no_offload_and_no_drops():
    rec = Recorder()
    pool = TieredKVPool(LAYOUT, gpu_blocks=4, host_blocks=0, recorder=rec, device="cpu")
    pool.release(pool.admit([("sys", 0, 64)], 0), [("sys", 0, 64)])
    pool.admit([("sys", 1, 64)], 0)
    snap = rec.snapshot()
    assert snap.tier("gpu").evictions_total == 4
    assert snap.link("gpu", "host").blocks == 0 and snap.link("gpu", "host").drops == 0


def test_admission_refuses_what_does_not_fit():
    rec = Recorder()
    pool = TieredKVPool(LAYOUT, gpu_blocks=4, host_blocks=8, recorder=rec, device="cpu")
    held = pool.admit([("sys", 0, 48)], output_tokens=16)
    assert held is not None
    assert pool.admit([("sys", 1, 16)], output_tokens=0) is None
    assert rec.snapshot().tier("gpu").free_blocks == 0
