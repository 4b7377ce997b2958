"""Occupancy read while the engine is between two updates: clamped and consistent.

Derived occupancy (``in_use = allocations + reuses - frees``, ``cached = ...``) is read
field by field while another thread changes the fields, so a snapshot can catch half of
a sequence. :meth:`TierRecorder.snapshot` clamps what it derives: these tests hammer it
from a second thread and check every reading, then check the exact values once quiet.
"""

from __future__ import annotations

import threading
import time

from kvobs.recorder import Recorder
from kvobs.telemetry.series import snapshot_series

CAPACITY = 64


def churn(tier, stop: threading.Event) -> None:  # type: ignore[no-untyped-def]
    # Each cycle keeps in_use + cached within capacity when applied atomically; readers
    # see the counters between any two of these calls.
    while not stop.is_set():
        for _ in range(200):
            tier.allocate(CAPACITY)
            tier.free(CAPACITY, cached=True)
            tier.reuse(CAPACITY // 2)
            tier.free(CAPACITY // 2)
            tier.evict(CAPACITY, reason="capacity")
            tier.store(CAPACITY)
            tier.evict(CAPACITY, reason="explicit")


def test_snapshots_under_concurrent_updates_stay_in_range() -> None:
    recorder = Recorder(engine="t", model="m")
    tier = recorder.add_tier("host", capacity_blocks=CAPACITY, block_tokens=16, block_bytes=64)
    stop = threading.Event()
    worker = threading.Thread(target=churn, args=(tier, stop), daemon=True)
    worker.start()
    readings = 0
    # Bounded by time (1.5 s) and count; thousands of readings on any machine.
    deadline = time.monotonic() + 1.5
    try:
        while time.monotonic() < deadline and readings < 200_000:
            snap = recorder.snapshot().tier("host")
            assert 0 <= snap.in_use_blocks <= CAPACITY, snap
            assert 0 <= snap.cached_blocks <= CAPACITY - snap.in_use_blocks, snap
            assert snap.free_blocks >= 0, snap
            series = snapshot_series(recorder.snapshot())
            assert all(v >= 0 for _, v in series["kvobs_tier_resident_blocks"])
            readings += 1
    finally:
        stop.set()
        worker.join(timeout=10)
    assert readings > 100
    quiet = recorder.snapshot().tier("host")
    assert (quiet.in_use_blocks, quiet.cached_blocks) == (0, 0)  # every cycle ends empty
    assert quiet.allocations + quiet.reuses == quiet.frees


def test_engine_readings_beyond_capacity_are_clamped() -> None:
    recorder = Recorder(engine="t", model="m")
    gpu = recorder.add_tier("gpu", capacity_blocks=10, block_tokens=16, block_bytes=64)
    gpu.set_resident(12, 5)  # an engine read while resizing, say
    snap = recorder.snapshot().tier("gpu")
    assert (snap.in_use_blocks, snap.cached_blocks, snap.free_blocks) == (10, 0, 0)
    gpu.set_resident(-3, 20)
    snap = recorder.snapshot().tier("gpu")
    assert (snap.in_use_blocks, snap.cached_blocks, snap.free_blocks) == (0, 10, 0)
    gpu.set_resident_source(lambda: (4, 3))
    snap = recorder.snapshot().tier("gpu")
    assert (snap.in_use_blocks, snap.cached_blocks, snap.free_blocks) == (4, 3, 3)


def test_derived_occupancy_after_lost_events_never_reads_negative() -> None:
    recorder = Recorder(engine="t", model="m")
    host = recorder.add_tier("host", capacity_blocks=8, block_tokens=16, block_bytes=64)
    host.evict(5)  # an adapter attached to a running engine sees evictions of blocks
    host.free(3)   # it never saw arrive
    snap = recorder.snapshot().tier("host")
    assert (snap.in_use_blocks, snap.cached_blocks, snap.free_blocks) == (0, 0, 8)
    host.allocate(20)  # and more allocations than capacity
    snap = recorder.snapshot().tier("host")
    assert snap.in_use_blocks == 8 and snap.free_blocks == 0
