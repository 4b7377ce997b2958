"""Transfer links: a timing-only link (``counts=False``) says so in its snapshot, a link
counts by default, and a link buffers 65536 duration samples before it drops (and counts)
the next one."""

from __future__ import annotations

from kvobs.recorder import LinkRecorder, Recorder


def test_a_timing_only_link_says_so_in_the_snapshot() -> None:
    rec = Recorder()
    rec.link("gpu", "host", counts=False).timed(0.5)
    rec.link("host", "gpu").transfer(2, 2048, 0.25)
    snap = rec.snapshot()
    assert snap.link("gpu", "host").counts is False
    assert snap.link("host", "gpu").counts is True


def test_asking_for_a_link_again_returns_the_one_with_its_counters() -> None:
    rec = Recorder()
    first = rec.link("gpu", "host", counts=False)
    first.transfer(4, 4096)
    again = rec.link("gpu", "host")
    assert again is first
    link = rec.snapshot().link("gpu", "host")
    assert (link.operations, link.blocks, link.bytes, link.counts) == (1, 4, 4096, False)


def test_a_link_built_alone_counts_its_transfers() -> None:
    assert LinkRecorder("gpu", "host").snapshot().counts is True


def test_a_link_drops_and_counts_the_duration_samples_past_65536() -> None:
    rec = Recorder()
    link = rec.link("gpu", "host")
    for _ in range(65536):
        link.sample(0.001)
    assert rec.snapshot().dropped_samples == 0
    link.sample(0.001)
    link.timed(0.002)
    assert rec.snapshot().dropped_samples == 2
    assert len(link.drain_durations()) == 65536
