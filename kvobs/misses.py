"""Why looked-up tokens missed, in words: the periodic summary log and ``kvobs report``.

The causes are :data:`~kvobs.snapshot.MISS_CAUSES` (``kvobs_miss_tokens_total{cause}``).
Each comes with its cure where there is one: evicted tokens come back with more capacity,
and the reuse profile says how many (:func:`capacity_gain`); cold tokens no cache size
helps; dropped ones come back with a host tier that refuses fewer offloads; tokens missed
within the capacity otherwise point at the engine's eviction policy.

Example:
    >>> said = miss_sentence(1000, {"cold": 210, "evicted": 120, "dropped": 30,
    ...                             "not_cacheable": 20, "unknown": 0}, gain=0.09)
    >>> for part in said.split(", "): print(part)
    38% of prompt tokens missed: 21% never seen
    12% evicted (2x the capacity wins back about 9 points)
    3% dropped by a full tier
    2% in partial blocks
"""

from __future__ import annotations

from collections.abc import Mapping

from kvobs.snapshot import MISS_CAUSES, ReuseSnapshot

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
#: The capacity step the evicted tokens' cure is told at.
GAIN_FACTOR = 2.0


def _percent(part: float, whole: float) -> str:
    share = 100 * part / whole
    return "<1%" if 0 < share < 0.5 else f"{share:.0f}%"


def miss_sentence(tokens: float, causes: Mapping[str, float],
                  gain: float | None = None) -> str:
    """One sentence: the share of ``tokens`` (looked up) that missed, split by cause (each
    a share of ``tokens``), with the evicted ones' cure: ``gain``, the share of references
    a cache :data:`GAIN_FACTOR` times as large would have hit (:func:`capacity_gain`).

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
        if cause == "evicted" and gain is not None:
            said += (f" ({GAIN_FACTOR:g}x the capacity wins back about {100 * gain:.0f} "
                     "points)")
        parts.append(said)
    return f"{_percent(missed, tokens)} of prompt tokens missed: " + ", ".join(parts)


def capacity_gain(prev: ReuseSnapshot | None, cur: ReuseSnapshot | None,
                  factor: float = GAIN_FACTOR) -> float | None:
    """The share of the block references counted between ``prev`` and ``cur`` (``prev``
    None: since the start) whose reuse distance lies beyond the capacity and within
    ``factor`` times it: what that much more capacity would have hit (None: no profile,
    or no reference in the interval).

    Example:
        >>> cur = ReuseSnapshot(10, 1.0, 8, ((10.0, 2.0), (20.0, 5.0), (float("inf"), 8.0)))
        >>> capacity_gain(None, cur)
        0.375
    """
    if cur is None:
        return None

    def upto(snap: ReuseSnapshot | None, size: float) -> float:
        if snap is None:
            return 0.0
        counted = [count for bound, count in snap.cumulative if bound <= size]
        return counted[-1] if counted else 0.0

    same = prev is not None and prev.cumulative and \
        [b for b, _ in prev.cumulative] == [b for b, _ in cur.cumulative]
    before = prev if same else None
    everything = upto(cur, float("inf")) - upto(before, float("inf"))
    if everything <= 0:
        return None
    capacity = float(cur.capacity_blocks)
    within = (upto(cur, factor * capacity) - upto(before, factor * capacity)) \
        - (upto(cur, capacity) - upto(before, capacity))
    return max(within, 0.0) / everything
