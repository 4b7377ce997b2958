"""Why looked-up tokens missed, in words: the periodic summary log and ``kvobs report``.

The causes are :data:`~kvobs.snapshot.MISS_CAUSES` (``kvobs_miss_tokens_total{cause}``).
Each comes with its cure where there is one: evicted tokens come back with more capacity,
and the reuse profile says how many (``kvobs_miss_recoverable_tokens_total``: those twice
the capacity would have hit); cold tokens no cache size helps; dropped ones come back
with a host tier that refuses fewer offloads; tokens missed within the capacity otherwise
point at the engine's eviction policy.

Example:
    >>> said = miss_sentence(1000, {"cold": 210, "evicted": 120, "dropped": 30,
    ...                             "not_cacheable": 20, "unknown": 0}, recoverable=90)
    >>> for part in said.split(", "): print(part)
    38% of prompt tokens missed: 21% never seen
    12% evicted (2x the capacity wins back 9 points)
    3% dropped by a full tier
    2% in partial blocks
"""

from __future__ import annotations

from collections.abc import Mapping

from kvobs.snapshot import MISS_CAUSES

#: Each cause as the sentence says it.
CAUSE_WORDS = {
    "cold": "never seen",
    "evicted": "evicted",
    "dropped": "dropped by a full tier",
    "in_flight": "still being offloaded",
    "other": "missed within the capacity",
    "not_cacheable": "in partial blocks",
    "unknown": "without block keys",
}
#: The capacity step the evicted tokens' cure is told at (the C profile's REUSE_MISS_WIDER).
GAIN_FACTOR = 2.0
#: The dashboard's legends ``kvobs report`` reads the sentence from: one series per cause
#: (``kvobs_miss_tokens_total{cause}``), and the share the larger capacity wins back
#: (``kvobs_miss_recoverable_tokens_total``).
CAUSE_LEGEND = "{{cause}}"
RECOVERABLE_LEGEND = f"{GAIN_FACTOR:g}x capacity wins back"


def _percent(part: float, whole: float) -> str:
    share = 100 * part / whole
    return "<1%" if 0 < share < 0.5 else f"{share:.0f}%"


def miss_sentence(tokens: float, causes: Mapping[str, float],
                  recoverable: float | None = None) -> str:
    """One sentence: the share of ``tokens`` (looked up) that missed, split by cause (in
    the unit of ``tokens``), with the evicted ones' cure: ``recoverable``, those of them
    a cache :data:`GAIN_FACTOR` times as large would have hit (None: unknown).

    Example:
        >>> miss_sentence(0, {}), miss_sentence(64, {"cold": 0})
        ('no prompt tokens looked up', 'no prompt token missed')
    """
    if tokens <= 0:
        return "no prompt tokens looked up"
    missed = sum(causes.get(cause, 0) for cause in MISS_CAUSES)
    if missed <= 0:
        return "no prompt token missed"
    parts = []
    for cause in MISS_CAUSES:
        share = causes.get(cause, 0)
        if share <= 0:
            continue
        said = f"{_percent(share, tokens)} {CAUSE_WORDS[cause]}"
        if cause == "evicted" and recoverable is not None:
            said += (f" ({GAIN_FACTOR:g}x the capacity wins back "
                     f"{_percent(recoverable, tokens).rstrip('%')} points)")
        parts.append(said)
    return f"{_percent(missed, tokens)} of prompt tokens missed: " + ", ".join(parts)
