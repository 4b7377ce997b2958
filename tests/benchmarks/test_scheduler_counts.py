"""The cachegrind summary parser and per-step arithmetic of benchmarks.vllm_scheduler_counts."""

from __future__ import annotations

import pytest

from benchmarks.vllm_scheduler_counts import Counts, parse_summary, report

# The tail of a real cachegrind run (valgrind 3.19, --cache-sim=yes) of the plain scheduler.
SUMMARY = """\
==4188== NOTE: further instances of this message will not be shown
==4188==
==4188== I   refs:      55,915,084,375
==4188== I1  misses:       751,026,836
==4188== LLi misses:           254,043
==4188== I1  miss rate:           1.34%
==4188== LLi miss rate:           0.00%
==4188==
==4188== D   refs:      25,165,847,001  (17,061,350,102 rd   + 8,104,496,899 wr)
==4188== D1  misses:       659,547,010  (   599,697,331 rd   +    59,849,679 wr)
==4188== LLd misses:        17,080,622  (    11,268,587 rd   +     5,812,035 wr)
==4188== D1  miss rate:           2.6% (           3.5%     +           0.7%  )
"""


def test_summary_fields_are_read_from_the_totals_column() -> None:
    counts = parse_summary(SUMMARY)
    assert counts.instructions == 55_915_084_375
    assert counts.data_refs == 25_165_847_001
    assert counts.l1_misses == 751_026_836 + 659_547_010
    assert counts.ll_misses == 254_043 + 17_080_622
    assert counts.cycles == (55_915_084_375 + 10 * (751_026_836 + 659_547_010)
                             + 100 * (254_043 + 17_080_622))


def test_a_summary_without_cache_simulation_names_what_is_missing() -> None:
    only_refs = "\n".join(line for line in SUMMARY.splitlines() if "refs" in line)
    with pytest.raises(RuntimeError, match=r"lacks d1_misses, i1_misses, lld_misses, "
                                           r"lli_misses .*--cache-sim=yes"):
        parse_summary(only_refs)


def test_per_step_is_the_difference_over_the_steps() -> None:
    start = Counts(100, 50, 10, 20, 1, 2)
    end = Counts(700, 350, 40, 50, 4, 5)
    step = end.per_step(start, 3)
    assert step == Counts(200, 100, 10, 10, 1, 1)
    assert step.cycles == 200 + 10 * 20 + 100 * 2
    row = report({"plain": step, "kvobs": Counts(220, 100, 10, 12, 1, 1)}, 72)["cycles"]
    assert row == {"plain": 600, "kvobs": 640, "added": 40, "ratio": pytest.approx(640 / 600,
                                                                                   abs=1e-4)}


def test_the_control_row_is_plain_vs_plain() -> None:
    plain, kvobs, control = Counts(200, 0, 0, 0, 0, 0), Counts(210, 0, 0, 0, 0, 0), \
        Counts(197, 0, 0, 0, 0, 0)
    rows = report({"plain": plain, "kvobs": kvobs, "control": control}, 72)
    assert rows["instructions"] == {"plain": 200, "kvobs": 210, "added": 10, "ratio": 1.05,
                                    "control_added": -3}
    assert "control_added" not in report({"plain": plain, "kvobs": kvobs}, 72)["instructions"]
