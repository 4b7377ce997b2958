"""A reuse profile that forgot blocks to stay within its memory bound says so on /metrics."""

from __future__ import annotations

import urllib.request

import kvobs
from kvobs.recorder import WRITTEN_MAX
from kvobs.reuse import ReuseProfile


def scrape(rec: kvobs.Recorder) -> dict[str, float]:
    telemetry = kvobs.start_telemetry(rec, metrics_addr="127.0.0.1:0")
    try:
        page = urllib.request.urlopen(telemetry.metrics_url, timeout=10).read().decode()
    finally:
        telemetry.close()
    values = {}
    for line in page.splitlines():
        if line.startswith("kvobs_reuse_"):
            name, value = line.rsplit(" ", 1)
            values[name.split("{")[0] + ("{" + name.split("{")[1] if "le=" in name else "")] \
                = float(value)
    return values


def test_forgotten_blocks_are_an_exported_counter() -> None:
    rec = kvobs.Recorder(engine="test", model="m")
    rec.add_tier("gpu", 100, 16, 1024)
    rec.reuse = ReuseProfile(100, rate=1.0, max_keys=50)  # a hand-set bound: 50 blocks
    rec.lookup(16 * 1000, keys=list(range(1000)))
    assert rec.reuse.forgotten == 950 and rec.reuse.tracked == 50
    exported = scrape(rec)
    assert exported["kvobs_reuse_forgotten_blocks_total"] == 950
    assert exported["kvobs_reuse_references_total"] == 1000


def test_a_default_profile_that_forgot_nothing_exports_zero() -> None:
    rec = kvobs.Recorder(engine="test", model="m")
    rec.add_tier("gpu", 100, 16, 1024)
    rec.lookup(64, keys=[1, 2, 3, 4])
    rec.written([5, 6])
    assert scrape(rec)["kvobs_reuse_forgotten_blocks_total"] == 0


def test_written_blocks_wait_in_order_and_bounded() -> None:
    rec = kvobs.Recorder(engine="test", model="m", profile_reuse=False)
    for start in range(0, 100_000, 10):
        rec.written(list(range(start, start + 10)))
    assert len(rec.written_pending) <= WRITTEN_MAX  # no keyed lookup ever comes: nothing piles up
    rec = kvobs.Recorder(engine="test", model="m")
    rec.add_tier("gpu", 100, 16, 1024)
    rec.written(["answer"])
    assert rec.reuse is None or rec.reuse.tracked == 0  # not handed over yet
    rec.lookup(16, keys=["answer"])  # written first, then looked up: a hit at 1 block
    assert rec.reuse is not None and rec.reuse.hit_ratio(rec.reuse.bounds[0]) == 1.0


def test_the_tracked_share_and_fractional_counts_are_exported() -> None:
    """At a rate of 1/4 the profile still tracks every block while they fit: the share is
    exported as 1, and each reference counts a quarter of a sample. Past max_keys the
    share halves down to the rate, blocks dropped on the way are not 'forgotten'."""
    rec = kvobs.Recorder(engine="test", model="m")
    rec.add_tier("gpu", 100, 16, 1024)
    rec.reuse = ReuseProfile(100, rate=0.25, max_keys=64)
    rec.lookup(16 * 10, keys=list(range(10)))
    exported = scrape(rec)
    assert exported["kvobs_reuse_tracking_rate"] == 1.0
    assert exported["kvobs_reuse_sample_rate"] == 0.25
    every = 'kvobs_reuse_sampled_references_total{engine="test",le="+Inf",model="m"}'
    assert exported[every] == 2.5
    rec.lookup(16 * 1000, keys=list(range(10, 1010)))
    exported = scrape(rec)
    assert exported["kvobs_reuse_tracking_rate"] == 0.25
    assert 0 < exported["kvobs_reuse_forgotten_blocks_total"] < 1010 - 64
