"""The recorder's clock and thrash window reach its trackers: an onload counts as thrash
only within the window (10 s by default) of the offload on the recorder's clock, and a
block's time in a tier is measured on that clock too."""

from __future__ import annotations

from kvobs.recorder import Recorder
from kvobs.samples import RESIDENCY

SECOND = 10**9


class Clock:
    """A virtual clock in int nanoseconds, moved by hand."""

    def __init__(self) -> None:
        self.ns = 0

    def __call__(self) -> int:
        return self.ns


def thrash_onloads(window_s: float | None, onload_after_s: float) -> int:
    clock = Clock()
    rec = Recorder(clock_ns=clock) if window_s is None else \
        Recorder(clock_ns=clock, thrash_window_s=window_s)
    host = rec.add_tier("host", 8, block_tokens=16, block_bytes=0)
    host.store(1, keys=["a"])
    clock.ns = int(onload_after_s * SECOND)
    host.reuse(1, keys=["a"])
    return rec.snapshot().thrash.onloads_in_window


def test_an_onload_counts_as_thrash_within_the_default_ten_seconds() -> None:
    assert thrash_onloads(None, 9.5) == 1
    assert thrash_onloads(None, 10.5) == 0


def test_an_onload_counts_as_thrash_within_the_window_asked_for() -> None:
    assert thrash_onloads(2.0, 1.5) == 1
    assert thrash_onloads(2.0, 3.0) == 0


def test_a_blocks_time_in_a_tier_is_measured_on_the_recorders_clock() -> None:
    clock = Clock()
    rec = Recorder(clock_ns=clock, residency_rate=1.0)
    gpu = rec.add_tier("gpu", 8, block_tokens=16, block_bytes=0)
    gpu.allocate(1, keys=["a"])
    clock.ns = 5 * SECOND
    gpu.evict(1, keys=["a"])
    found = {tuple(labels.items()): h for metric, labels, h in rec.histograms.collect()
             if metric == RESIDENCY}
    stay = found[(("tier", "gpu"),)]
    assert (stay.count, stay.sum) == (1, 5.0)
