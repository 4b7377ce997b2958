"""Soak: 1e7 block events over 1e6 distinct keys; RSS growth bounded, untracked exported.

Runs ``benchmarks/reliability.py soak`` in its own process (so RSS is the recorder's,
not the test runner's). About 10 s here; the 120 s timeout only catches a hang.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_ten_million_events_over_a_million_keys_stay_bounded() -> None:
    result = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "reliability.py"), "soak",
         "--events", "10000000", "--keys", "1000000"],
        capture_output=True, text=True, timeout=120, check=True)
    soak = json.loads(result.stdout.strip().splitlines()[-1])
    assert soak["events"] >= 10_000_000
    # The thrash tracker holds at most 2^18 keys and forgets the rest, counting them.
    assert soak["tracked_blocks"] <= 1 << 18
    assert soak["untracked_blocks"] > 1_000_000
    assert soak["exported_untracked"] == [[{}, soak["untracked_blocks"]]]  # JSON lists
    # Bounds: everything kvobs keeps is capped (2^18 thrash keys at ~220 bytes, 16,384
    # sampled residency keys, 65,536 buffered durations per kind), ~95 MiB measured on
    # CPython 3.11; growth over the second half is allocator noise (~5 MiB measured).
    assert soak["rss_growth_mib"] < 160, soak
    assert soak["rss_growth_second_half_mib"] < 16, soak
