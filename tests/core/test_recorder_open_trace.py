"""Recorder.open_trace: the trace file it opens takes one JSON line per keyed lookup, at
once (line-buffered), stamped by the given clock and bounded by ``max_bytes``; a path
that cannot be created is a ConfigError naming the file and the reason."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from kvobs.errors import ConfigError
from kvobs.recorder import Recorder
from kvobs.trace import key_hex, read_trace


def test_a_keyed_lookup_is_in_the_trace_file_before_the_file_is_closed(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    rec = Recorder()
    writer = rec.open_trace(str(path), clock=lambda: 12.5)
    assert writer is rec.trace
    rec.lookup(32, keys=[1, 2])
    # line-buffered: another reader sees the line while the writer still holds the file
    lines = path.read_text(encoding="utf-8").splitlines()
    assert [json.loads(line) for line in lines] == [
        {"blocks": [key_hex(1), key_hex(2)], "ts": 12.5}
    ]
    writer.close()


def test_the_trace_reads_back_as_the_lookups_in_order(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    rec = Recorder()
    writer = rec.open_trace(str(path), clock=lambda: 3.0)
    rec.lookup(16, keys=["a"])
    rec.lookup(16, gpu_hit=16, keys=["a", "b"])
    writer.close()
    with path.open(encoding="utf-8") as lines:
        records = list(read_trace(lines))
    assert [r.blocks for r in records] == [[key_hex("a")], [key_hex("a"), key_hex("b")]]
    assert [r.ts for r in records] == [3.0, 3.0]
    assert not any(r.written for r in records)


def test_open_trace_overwrites_an_existing_file(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    path.write_text('{"blocks": ["old"], "ts": 0}\n', encoding="utf-8")
    rec = Recorder()
    writer = rec.open_trace(str(path), clock=lambda: 1.0)
    rec.lookup(16, keys=[7])
    writer.close()
    assert path.read_text(encoding="utf-8") == f'{{"blocks":["{key_hex(7)}"],"ts":1.0}}\n'


def test_the_trace_stops_at_max_bytes_and_counts_the_lookups_it_skipped(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    rec = Recorder()
    line = f'{{"blocks":["{key_hex(1)}"],"ts":1.0}}\n'
    writer = rec.open_trace(str(path), max_bytes=len(line) + 10, clock=lambda: 1.0)
    for key in range(1, 4):
        rec.lookup(16, keys=[key])
    writer.close()
    assert path.read_text(encoding="utf-8") == line
    assert writer.skipped_lookups == 2
    assert writer.written_bytes == writer.max_bytes == len(line) + 10


def test_a_trace_path_in_a_missing_directory_is_a_config_error_naming_it(tmp_path: Path) -> None:
    path = str(tmp_path / "no-such-dir" / "trace.jsonl")
    message = (f"trace file {path!r} cannot be written (No such file or directory): pass "
               "a path in a writable directory")
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
        Recorder().open_trace(path)
