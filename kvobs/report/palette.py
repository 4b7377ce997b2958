"""One colour per tier, per lookup outcome and per transfer direction, everywhere.

``kvobs report``, ``kvobs top`` and the Grafana dashboards draw the GPU tier in the same
green, the host tier in the same blue, an offload (gpu -> host) in the same orange, so a
person who learnt the colours on one picture reads the next one at a glance. A hit on a
tier takes that tier's colour; a miss is red. States of one tier are shades of its colour
(in use full, cached lighter). Only the standard library: the terminal view and the
dashboard sources import this without matplotlib.

Example:
    >>> series_color({"tier": "gpu", "state": "in_use"}) == TIERS["gpu"]
    True
    >>> series_color({"outcome": "host_hit"}) == TIERS["host"]
    True
    >>> series_color({"src_tier": "gpu", "dst_tier": "host"})
    '#FF9830'
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping

#: Tier -> colour (Grafana's named colours: green, blue, purple).
TIERS: dict[str, str] = {
    "gpu": "#56A64B",
    "host": "#3274D9",
    "disk": "#A352CC",
}

#: Lighter shade of each tier, for its cached (not in use) blocks.
CACHED: dict[str, str] = {
    "gpu": "#96D98D",
    "host": "#8AB8FF",
    "disk": "#CA95E5",
}

#: Lookup outcome -> colour: a hit on a tier is that tier's colour.
OUTCOMES: dict[str, str] = {
    "gpu_hit": TIERS["gpu"],
    "host_hit": TIERS["host"],
    "disk_hit": TIERS["disk"],
    "miss": "#E02F44",
}

#: (src_tier, dst_tier) -> colour: offloads warm, onloads cool.
DIRECTIONS: dict[tuple[str, str], str] = {
    ("gpu", "host"): "#FF9830",
    ("host", "gpu"): "#1F60C4",
    ("host", "disk"): "#F2CC0C",
    ("disk", "host"): "#8F3BB8",
    ("gpu", "disk"): "#C4162A",
    ("disk", "gpu"): "#5794F2",
}

#: Anything else (capacity lines, totals): a neutral grey.
NEUTRAL = "#8E8E8E"

#: Colours for series the palette does not name (thrash signals, eviction reasons), in
#: order: none of them is a tier's or a direction's, so they are never mistaken for one.
OTHERS: tuple[str, ...] = (
    "#19A0A0", "#D683CE", "#8C564B", "#7F7F7F", "#BCBD22", "#17BECF", "#E377C2", "#393B79",
)

#: Labels the palette reads. A series with any other label (an eviction ``reason``, a
#: ``model``) takes no palette colour: its lines must stay apart from each other.
PALETTE_LABELS = frozenset({"tier", "state", "outcome", "src_tier", "dst_tier"})

#: Values the palette knows, per label, for naming every series a legend can produce.
LABEL_VALUES: dict[str, tuple[str, ...]] = {
    "tier": tuple(TIERS),
    "state": ("in_use", "cached"),
    "outcome": tuple(OUTCOMES),
}


def dashed(name: str) -> bool:
    """Whether a series is the second of a pair that shares a colour: p99 next to p50,
    failed next to dropped, a tier's capacity next to its occupancy."""
    return name.startswith(("p99", "failed")) or name.endswith("capacity")


def tier_color(tier: str, state: str | None = None) -> str:
    """Colour of ``tier`` (a lighter shade for ``state="cached"``)."""
    if state == "cached":
        return CACHED.get(tier, NEUTRAL)
    return TIERS.get(tier, NEUTRAL)


def direction_color(src: str, dst: str) -> str:
    """Colour of the transfer direction ``src`` -> ``dst``."""
    return DIRECTIONS.get((src, dst), NEUTRAL)


def series_color(labels: Mapping[str, str]) -> str | None:
    """The colour a series with these labels takes, or None when no rule names it.

    A direction (``src_tier``/``dst_tier``) wins over an outcome, which wins over a tier.
    Labels outside :data:`PALETTE_LABELS` mean no palette colour.

    Example:
        >>> series_color({"tier": "gpu", "reason": "capacity"}) is None
        True
    """
    if set(labels) - PALETTE_LABELS:
        return None
    if "src_tier" in labels and "dst_tier" in labels:
        return DIRECTIONS.get((labels["src_tier"], labels["dst_tier"]))
    if "outcome" in labels:
        return OUTCOMES.get(labels["outcome"])
    if "tier" in labels:
        if labels["tier"] not in TIERS:
            return None
        return tier_color(labels["tier"], labels.get("state"))
    return None


def legend_colors(legend: str) -> dict[str, str]:
    """Every series name a Grafana ``{{label}}`` legend can produce -> its colour.

    For the dashboards' per-panel colour overrides: a legend that uses a label outside
    :data:`PALETTE_LABELS`, or none of them, gets none.

    Example:
        >>> legend_colors("p99 {{src_tier}} → {{dst_tier}}")["p99 gpu → host"]
        '#FF9830'
        >>> legend_colors("{{tier}} {{reason}}")
        {}
    """
    used = re.findall(r"\{\{\s*(\w+)\s*\}\}", legend)
    if not used or set(used) - PALETTE_LABELS:
        return {}
    if {"src_tier", "dst_tier"} & set(used):
        choices = [dict(zip(("src_tier", "dst_tier"), pair, strict=True)) for pair in DIRECTIONS]
    else:
        keys = sorted(set(used))
        choices = [dict(zip(keys, values, strict=True))
                   for values in itertools.product(*(LABEL_VALUES[k] for k in keys))]
    result = {}
    for labels in choices:
        color = series_color(labels)
        if color is not None:
            name = legend
            for key, value in labels.items():
                name = re.sub(r"\{\{\s*" + key + r"\s*\}\}", value, name)
            result[name.strip()] = color
    return result
