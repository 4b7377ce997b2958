"""Recorder invariants: used + free = capacity, counters never go back, no lost updates."""

import itertools
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvobs.errors import ConfigError, UnknownTierError
from kvobs.recorder import Recorder


def make(capacity=64):
    rec = Recorder(engine="test", model="m")
    return rec, rec.add_tier("gpu", capacity_blocks=capacity, block_tokens=16, block_bytes=1024)


def test_state_transitions():
    rec, gpu = make(10)
    gpu.allocate(4)  # free -> in use
    gpu.free(3, cached=True)  # in use -> cached
    gpu.free(1)  # in use -> free
    gpu.reuse(2)  # cached -> in use
    gpu.evict(1)  # cached -> free
    gpu.store(5)  # free -> cached
    t = rec.snapshot().tier("gpu")
    assert (t.in_use_blocks, t.cached_blocks, t.free_blocks) == (2, 5, 3)
    assert (t.allocations, t.frees, t.reuses, t.stores, t.evictions_total) == (4, 4, 2, 5, 1)


def test_unknown_eviction_reason_counts_as_other():
    rec, gpu = make()
    gpu.store(2)
    gpu.evict(1, reason="cosmic-ray")
    gpu.evict(1, reason="explicit")
    evictions = rec.snapshot().tier("gpu").evictions
    assert evictions["other"] == 1 and evictions["explicit"] == 1


def test_lookup_outcomes_sum_to_tokens():
    rec, _ = make()
    rec.lookup(100, gpu_hit=48, host_hit=32)
    rec.lookup(10, gpu_hit=16)  # hits beyond the tokens raise the tokens
    lookups = rec.snapshot().lookups
    assert lookups.outcomes() == {"gpu_hit": 64, "host_hit": 32, "disk_hit": 0, "miss": 20}
    assert sum(lookups.outcomes().values()) == lookups.tokens == 116
    assert lookups.lookups == 2


def test_resident_source_and_override():
    rec, gpu = make(10)
    gpu.set_resident(3, 4)
    assert rec.snapshot().tier("gpu").free_blocks == 3
    gpu.set_resident_source(lambda: (1, 1))
    assert rec.snapshot().tier("gpu").resident_blocks == 2


def test_unknown_tier_and_bad_sizes():
    rec, _ = make()
    with pytest.raises(UnknownTierError, match="tier 'host' is not registered"):
        rec.tier("host")
    with pytest.raises(ConfigError, match="capacity_blocks must be a non-negative integer"):
        rec.add_tier("host", capacity_blocks=-1, block_tokens=16, block_bytes=1)
    with pytest.raises(ConfigError, match="invalid"):
        rec.link("gpu", "Host Memory")


def test_link_counts_and_bounded_duration_buffer():
    rec, _ = make()
    link = rec.link("gpu", "host")
    link.buffer_limit = 3
    for _ in range(5):
        link.transfer(2, 2048, 0.001)
    link.fail(3)
    link.drop(4)
    snap = rec.snapshot()
    assert snap.link("gpu", "host").blocks == 10
    assert (snap.link("gpu", "host").failures, snap.link("gpu", "host").drops) == (3, 4)
    assert snap.dropped_samples == 2
    assert link.drain_durations() == [0.001] * 3
    assert link.drain_durations() == []


def test_error_is_counted_and_logged_at_most_once_a_minute():
    import structlog

    rec, _ = make()
    with structlog.testing.capture_logs() as logs:
        for _ in range(5):
            rec.error("adapter.x", RuntimeError("boom"))
    assert rec.snapshot().errors == {"adapter.x": 5}
    assert len([e for e in logs if e["event"] == "instrumentation_error"]) == 1


operations = st.lists(
    st.tuples(
        st.sampled_from(["alloc", "free", "free_cached", "reuse", "evict", "store"]),
        st.integers(1, 8),
    ),
    max_size=200,
)


@settings(max_examples=200, deadline=None)
@given(operations)
def test_invariants_hold_for_any_valid_sequence(ops):
    """A model pool applies only legal transitions; the recorder must agree at every step."""
    capacity = 64
    rec, gpu = make(capacity)
    free, in_use, cached = capacity, 0, 0
    previous = rec.snapshot().tier("gpu")
    for op, n in ops:
        if op == "alloc" and free >= n:
            free, in_use = free - n, in_use + n
            gpu.allocate(n)
        elif op == "free" and in_use >= n:
            in_use, free = in_use - n, free + n
            gpu.free(n)
        elif op == "free_cached" and in_use >= n:
            in_use, cached = in_use - n, cached + n
            gpu.free(n, cached=True)
        elif op == "reuse" and cached >= n:
            cached, in_use = cached - n, in_use + n
            gpu.reuse(n)
        elif op == "evict" and cached >= n:
            cached, free = cached - n, free + n
            gpu.evict(n)
        elif op == "store" and free >= n:
            free, cached = free - n, cached + n
            gpu.store(n)
        t = rec.snapshot().tier("gpu")
        assert (t.in_use_blocks, t.cached_blocks, t.free_blocks) == (in_use, cached, free)
        assert t.in_use_blocks + t.cached_blocks + t.free_blocks == t.capacity_blocks
        for field in ("allocations", "frees", "reuses", "stores", "evictions_total"):
            assert getattr(t, field) >= getattr(previous, field)  # counters never go back
        previous = t


def test_eight_threads_lose_no_update():
    rec, gpu = make(10**9)
    link = rec.link("gpu", "host")
    rounds, threads = 20_000, 8
    start = threading.Barrier(threads)

    def worker():
        start.wait()
        for _ in range(rounds):
            gpu.allocate(2)
            gpu.free(1, cached=True)
            gpu.free(1)
            gpu.reuse(1)
            gpu.free(1, cached=True)
            gpu.evict(1, "capacity")
            rec.lookup(16, gpu_hit=8)
            link.transfer(1, 64, 1e-6)

    pool = [threading.Thread(target=worker) for _ in range(threads)]
    for thread in pool:
        thread.start()
    snapshots = []
    while any(thread.is_alive() for thread in pool):
        snapshots.append(rec.snapshot())
    for thread in pool:
        thread.join()
    total = rounds * threads
    snap = rec.snapshot()
    t = snap.tier("gpu")
    assert (t.allocations, t.frees, t.reuses, t.evictions["capacity"]) == (
        2 * total,
        3 * total,
        total,
        total,
    )
    assert (t.in_use_blocks, t.cached_blocks, t.free_blocks) == (0, 0, t.capacity_blocks)
    assert (snap.lookups.tokens, snap.lookups.gpu_hit, snap.lookups.lookups) == (
        16 * total,
        8 * total,
        total,
    )
    assert (snap.link("gpu", "host").operations, snap.link("gpu", "host").bytes) == (
        total,
        64 * total,
    )
    for earlier, later in itertools.pairwise(snapshots):
        assert later.tier("gpu").allocations >= earlier.tier("gpu").allocations
        assert later.lookups.tokens >= earlier.lookups.tokens
