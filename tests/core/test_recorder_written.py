"""Blocks written without a lookup (Recorder.written): up to WRITTEN_MAX wait for the next
keyed lookup; past it they go at once to the reuse profile (as recent blocks, not as
references, starting the profile where the recorder keeps one) and to the trace as a
``written`` line."""

from __future__ import annotations

from pathlib import Path

from kvobs.recorder import WRITTEN_MAX, Recorder
from kvobs.trace import key_hex, read_trace

BLOCK = 16


def recorder(profile_reuse: bool = True) -> Recorder:
    rec = Recorder(profile_reuse=profile_reuse)
    rec.add_tier("gpu", 8, block_tokens=BLOCK, block_bytes=0)
    return rec


def answer(n: int) -> list[str]:
    return [f"w{i}" for i in range(n)]


def test_written_blocks_wait_up_to_the_bound_and_reach_the_trace_past_it(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    rec = recorder()
    writer = rec.open_trace(str(path), clock=lambda: 2.0)
    rec.written(answer(WRITTEN_MAX))
    assert len(rec.written_pending) == WRITTEN_MAX
    assert path.read_text(encoding="utf-8") == ""
    rec.written(["last"])
    assert rec.written_pending == []
    writer.close()
    with path.open(encoding="utf-8") as lines:
        records = list(read_trace(lines))
    assert len(records) == 1
    assert records[0].written is True
    assert records[0].blocks == [key_hex(k) for k in [*answer(WRITTEN_MAX), "last"]]
    assert records[0].ts == 2.0


def test_written_blocks_past_the_bound_are_recent_in_the_profile_but_not_counted() -> None:
    rec = recorder()
    rec.written(answer(WRITTEN_MAX + 1))  # the first flush starts the profile
    rec.lookup(BLOCK, keys=[f"w{WRITTEN_MAX}"])  # the most recent block written
    snap = rec.snapshot()
    assert snap.reuse is not None and snap.reuse.references == 1
    causes = snap.lookups.miss_causes()
    assert (causes["other"], causes["cold"]) == (BLOCK, 0)  # an LRU cache would have it


def test_written_blocks_past_the_bound_reach_a_profile_started_by_hand() -> None:
    rec = recorder(profile_reuse=False)
    rec.start_reuse_profile()
    rec.written(answer(WRITTEN_MAX + 1))
    rec.lookup(BLOCK, keys=[f"w{WRITTEN_MAX}"])
    snap = rec.snapshot()
    assert snap.reuse is not None and snap.reuse.references == 1
    assert snap.lookups.miss_causes()["other"] == BLOCK


def test_written_blocks_past_the_bound_start_no_profile_where_the_recorder_keeps_none() -> None:
    rec = recorder(profile_reuse=False)
    rec.written(answer(WRITTEN_MAX + 1))
    assert rec.written_pending == []
    assert rec.snapshot().reuse is None
