"""A curve from a small in-memory trace (:func:`kvobs.whatif.curve_from_trace`): only
looked-up blocks are references (written ones are not), the answer is exact, and a trace
with nothing looked up, or a bad line, is named by its source."""

from __future__ import annotations

import io

import pytest

from kvobs.errors import ConfigError
from kvobs.whatif import curve_from_trace

TRACE = ('{"blocks": ["a", "b"], "ts": 0}\n'
         '{"written": ["c", "d", "e"], "ts": 1}\n'
         '\n'
         '{"blocks": ["a", "b", "c"], "ts": 2}\n')


@pytest.mark.parametrize("exact_limit", [5, 6, 1])
def test_only_looked_up_blocks_are_references_and_the_replay_is_exact(exact_limit: int) -> None:
    curve = curve_from_trace(io.StringIO(TRACE), "chat.jsonl", exact_limit=exact_limit)
    assert (curve.references, curve.exact, curve.source) == (5.0, True, "chat.jsonl")
    # a, b miss; the writes of c, d, e push them to depth 5; a, b, c then hit at 5
    assert [curve.hit_ratio(n) for n in (1, 4, 5, 100)] == [0.0, 0.0, pytest.approx(0.6),
                                                             pytest.approx(0.6)]


def test_a_trace_of_writes_alone_has_no_references_named_by_its_source() -> None:
    with pytest.raises(ConfigError) as raised:
        curve_from_trace(io.StringIO('{"written": ["a"]}\n'), "w.jsonl")
    assert str(raised.value) == ("w.jsonl: the trace holds no block references: record one "
                                 "with `kvobs demo --trace-out FILE`")


def test_a_bad_line_is_named_by_the_traces_source_and_number() -> None:
    with pytest.raises(ConfigError, match=r"^bad\.jsonl:2: not JSON"):
        curve_from_trace(io.StringIO('{"blocks": ["a"]}\n{oops\n'), "bad.jsonl")
    with pytest.raises(ConfigError, match=r"^trace:1: not JSON"):
        curve_from_trace(io.StringIO("{oops\n"))
