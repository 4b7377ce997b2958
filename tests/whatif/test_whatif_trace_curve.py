"""A curve from a small in-memory trace (:func:`kvobs.whatif.curve_from_trace`): only
looked-up blocks are references (written ones are not), the answer is exact, and a trace
with nothing looked up, or a bad line, is named by its source."""

from __future__ import annotations

import io
import json

import pytest

from kvobs.errors import ConfigError
from kvobs.reuse import default_rate
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


def wide_trace() -> str:
    """200,000 distinct blocks looked up once, then the first 20,000 again: 220,000
    references, 20,000 hits at any size of 200,000 blocks or more."""
    lines = [json.dumps({"blocks": [str(i) for i in range(s, s + 100)]})
             for s in range(0, 200_000, 100)]
    return "\n".join(lines + lines[:200])


def test_up_to_the_exact_limit_every_block_is_tracked_however_many() -> None:
    curve = curve_from_trace(io.StringIO(wide_trace()), exact_limit=220_000)
    assert curve.exact and curve.references == 220_000
    assert curve._profile is not None and curve._profile.rate == 1.0
    assert curve.hit_ratio(200_000) == pytest.approx(20_000 / 220_000, abs=1e-12)
    assert curve.hit_ratio(150_000) == 0.0


def test_past_the_exact_limit_blocks_beyond_the_bound_are_sampled() -> None:
    curve = curve_from_trace(io.StringIO(wide_trace()), exact_limit=219_999)
    profile = curve._profile
    assert profile is not None and not curve.exact
    assert (profile.max_keys, profile.rate) == (1 << 16, default_rate(200_000))
    assert profile.tracking_rate < 1 and profile.forgotten == 0
    assert curve.hit_ratio(250_000) == pytest.approx(20_000 / 220_000, abs=0.01)
