"""The reuse profile against the reference pool's own hits (the demo's engine).

The pool is driven by the demo's serving loop and chat workload; its measured hit ratio
is what it found for its lookups (GPU and host hits over looked-up tokens), and its own
cache size is the distinct blocks it held (GPU and host together: an onloaded block keeps
its host copy, so the tiers are neither fully exclusive nor inclusive), averaged over the
run after its first third. The profile, fed the lookups and the answers' blocks written
at release, predicts that hit ratio at that size.
"""

from __future__ import annotations

import pytest

from kvobs.pool.serving import ServingLoop
from kvobs.pool.tiered import TieredKVPool
from kvobs.pool.workload import ChatWorkload
from kvobs.presets import preset_layout
from kvobs.recorder import Recorder


def run_pool(rec: Recorder, seconds: float = 300.0) -> tuple[float, float]:
    """``(measured hit ratio, distinct blocks held)`` of the pool over ``seconds``."""
    pool = TieredKVPool(preset_layout("qwen2.5-0.5b"), 256, 1024, rec, device="cpu")
    loop = ServingLoop(pool, ChatWorkload(seed=7))
    held = []
    while loop.now_s < seconds:
        loop.step()
        held.append(len(pool._gpu_by_hash.keys() | pool._host_by_hash.keys()))
    lookups = rec.snapshot().lookups
    steady = held[len(held) // 3:]
    return (lookups.gpu_hit + lookups.host_hit) / lookups.tokens, sum(steady) / len(steady)


def test_profile_predicts_the_pools_measured_hit_ratio_at_its_own_size() -> None:
    rec = Recorder(engine="demo")
    measured, size = run_pool(rec)
    profile = rec.reuse
    assert profile is not None and profile.rate == 1.0  # exact: no salt changes this
    assert 0.3 < measured < 0.7
    assert profile.hit_ratio(size) == pytest.approx(measured, abs=0.03)
    ceiling = profile.hit_ratio(profile.bounds[-1])
    assert ceiling >= measured  # the curve never tops out below what the pool achieved


def test_without_the_written_answers_the_profile_misses_the_pool() -> None:
    """The mutant this test file exists for: lookups alone (answers never written)."""
    rec = Recorder(engine="demo")
    rec.written = lambda keys: None  # type: ignore[method-assign]
    measured, size = run_pool(rec)
    assert rec.reuse is not None
    assert abs(rec.reuse.hit_ratio(size) - measured) > 0.03
