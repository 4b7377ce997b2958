"""One colour per tier, per lookup outcome and per transfer direction, everywhere.

``kvobs report``, ``kvobs top`` and the Grafana dashboards draw the GPU tier in the same
green, the host tier in the same blue, an offload (gpu -> host) in the same orange, so a
person who learnt the colours on one picture reads the next one at a glance. A hit on a
tier takes that tier's colour; a miss is red. What splits a tier further is a shade of
its colour: a state (in use full, cached lighter) or an eviction reason (capacity full,
explicit darker and dashed, reset lighter and dotted, other palest and dash-dotted), so
"gpu capacity" and "host other" never share a hue. This module is the only table:
``kvobs.top``, ``kvobs.report`` and ``dashboards`` import it, never each other's. Only
the standard library (and :mod:`kvobs.catalog`'s label values).

Example:
    >>> series_color({"tier": "gpu", "state": "in_use"}) == TIERS["gpu"]
    True
    >>> series_color({"outcome": "host_hit"}) == TIERS["host"]
    True
    >>> series_color({"src_tier": "gpu", "dst_tier": "host"})
    '#FF9830'
    >>> series_style({"tier": "host", "reason": "reset"}, "host reset")
    Style(color='#8AB8FF', line='dot')
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping
from dataclasses import dataclass

from kvobs.catalog import EVICTION_REASONS, LOOKUP_OUTCOMES, RESIDENT_STATES

#: Tier -> its shades, darkest first: ``dark``, ``base`` (the tier's colour), ``light``,
#: ``pale``. Grafana's named colours (green, blue, purple) and a teal for ``remote``.
SHADES: dict[str, dict[str, str]] = {
    "gpu": {"dark": "#37872D", "base": "#56A64B", "light": "#96D98D", "pale": "#C8F2C2"},
    "host": {"dark": "#1F60C4", "base": "#3274D9", "light": "#8AB8FF", "pale": "#C0D8FF"},
    "disk": {"dark": "#7A2FA3", "base": "#A352CC", "light": "#CA95E5", "pale": "#E5C8F5"},
    "remote": {"dark": "#0B6666", "base": "#129494", "light": "#6FCFCF", "pale": "#BDEDED"},
}

#: Tier -> colour.
TIERS: dict[str, str] = {tier: shades["base"] for tier, shades in SHADES.items()}

#: Lighter shade of each tier, for its cached (not in use) blocks.
CACHED: dict[str, str] = {tier: shades["light"] for tier, shades in SHADES.items()}

#: Resident state -> shade of the tier's colour.
STATE_SHADES: dict[str, str] = {"in_use": "base", "cached": "light"}

#: Eviction reason -> (shade of the tier's colour, line). Capacity, the one that matters
#: for sizing, is the tier's own colour, solid.
REASONS: dict[str, tuple[str, str]] = {
    "capacity": ("base", "solid"),
    "explicit": ("dark", "dash"),
    "reset": ("light", "dot"),
    "other": ("pale", "dashdot"),
}

#: Line name -> Grafana ``custom.lineStyle`` (the report draws the same dash pattern).
LINES: dict[str, dict[str, object]] = {
    "solid": {"fill": "solid"},
    "dash": {"fill": "dash", "dash": [10, 10]},
    "dot": {"fill": "dot", "dash": [0, 10]},
    "dashdot": {"fill": "dash", "dash": [12, 6, 2, 6]},
}

#: Grafana ``custom.lineWidth`` of a dashed, dotted or dash-dotted line (solid: 1): a
#: broken line in a light shade needs the width to stay visible.
BROKEN_LINE_WIDTH = 2

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

#: Colours for series the palette does not name (thrash signals, replicas), in order:
#: none of them is a tier's shade or a direction's, so they are never mistaken for one.
OTHERS: tuple[str, ...] = (
    "#D683CE", "#8C564B", "#7F7F7F", "#BCBD22", "#E377C2", "#393B79", "#FF7383", "#6B4E16",
)

#: Labels the palette reads. A series with any other label (a ``model``) takes no
#: palette colour: its lines must stay apart from each other.
PALETTE_LABELS = frozenset({"tier", "state", "reason", "outcome", "src_tier", "dst_tier"})

#: Values the palette knows, per label, for naming every series a legend can produce.
LABEL_VALUES: dict[str, tuple[str, ...]] = {
    "tier": tuple(TIERS),
    "state": RESIDENT_STATES,
    "reason": EVICTION_REASONS,
    "outcome": LOOKUP_OUTCOMES,
}


@dataclass(frozen=True)
class Style:
    """How one series is drawn: a colour and a line (a key of :data:`LINES`)."""

    color: str
    line: str = "solid"


def dashed(name: str) -> bool:
    """Whether a series is the second of a pair that shares a colour: p99 next to p50,
    failed next to dropped, a tier's capacity next to its occupancy (a reference line)."""
    return name.startswith(("p99", "failed")) or name.endswith(" capacity")


def tier_color(tier: str, state: str | None = None) -> str:
    """Colour of ``tier`` (a lighter shade for ``state="cached"``)."""
    shades = SHADES.get(tier)
    if shades is None:
        return NEUTRAL
    return shades[STATE_SHADES.get(state or "in_use", "base")]


def direction_color(src: str, dst: str) -> str:
    """Colour of the transfer direction ``src`` -> ``dst``."""
    return DIRECTIONS.get((src, dst), NEUTRAL)


def series_style(labels: Mapping[str, str], name: str = "") -> Style | None:
    """How a series with these labels (and legend ``name``) is drawn, or None when no
    rule names it.

    A direction (``src_tier``/``dst_tier``) wins over an outcome, which wins over a tier;
    a tier's ``state`` or eviction ``reason`` picks a shade (and a reason a dash). Labels
    outside :data:`PALETTE_LABELS` mean no palette colour.

    Example:
        >>> series_style({"tier": "gpu", "model": "m"}) is None
        True
        >>> series_style({"tier": "gpu"}, "gpu capacity")
        Style(color='#56A64B', line='dash')
    """
    if set(labels) - PALETTE_LABELS:
        return None
    color: str | None = None
    line = "dash" if dashed(name) else "solid"
    if "src_tier" in labels and "dst_tier" in labels:
        color = DIRECTIONS.get((labels["src_tier"], labels["dst_tier"]))
    elif "outcome" in labels:
        color = OUTCOMES.get(labels["outcome"])
    elif labels.get("tier") in SHADES:
        shades = SHADES[labels["tier"]]
        if "reason" in labels:
            if labels["reason"] not in REASONS:
                return None
            shade, line = REASONS[labels["reason"]]
            color = shades[shade]
        else:
            color = shades[STATE_SHADES.get(labels.get("state", "in_use"), "base")]
    return None if color is None else Style(color, line)


def series_color(labels: Mapping[str, str]) -> str | None:
    """The colour of :func:`series_style`, or None.

    Example:
        >>> series_color({"tier": "gpu", "reason": "capacity"}) == TIERS["gpu"]
        True
    """
    style = series_style(labels)
    return None if style is None else style.color


def legend_series(legend: str) -> list[tuple[str, dict[str, str], Style]]:
    """Every series a Grafana ``{{label}}`` legend can produce that the palette names:
    ``(name, labels, style)``.

    For the dashboards' per-panel overrides: a legend that uses a label outside
    :data:`PALETTE_LABELS`, or none of them, gets none.

    Example:
        >>> legend_series("{{tier}} capacity")[0]
        ('gpu capacity', {'tier': 'gpu'}, Style(color='#56A64B', line='dash'))
        >>> legend_series("{{model}} @ {{instance}}")
        []
    """
    used = re.findall(r"\{\{\s*(\w+)\s*\}\}", legend)
    if not used or set(used) - PALETTE_LABELS:
        return []
    if {"src_tier", "dst_tier"} & set(used):
        choices = [dict(zip(("src_tier", "dst_tier"), pair, strict=True)) for pair in DIRECTIONS]
    else:
        keys = sorted(set(used))
        choices = [dict(zip(keys, values, strict=True))
                   for values in itertools.product(*(LABEL_VALUES[k] for k in keys))]
    result = []
    for labels in choices:
        name = legend
        for key, value in labels.items():
            name = re.sub(r"\{\{\s*" + key + r"\s*\}\}", value, name)
        style = series_style(labels, name.strip())
        if style is not None:
            result.append((name.strip(), labels, style))
    return result


def legend_styles(legend: str) -> dict[str, Style]:
    """Every series name a Grafana ``{{label}}`` legend can produce -> its style.

    Example:
        >>> legend_styles("p99 {{src_tier}} → {{dst_tier}}")["p99 gpu → host"]
        Style(color='#FF9830', line='dash')
    """
    return {name: style for name, _labels, style in legend_series(legend)}


def legend_colors(legend: str) -> dict[str, str]:
    """:func:`legend_styles`' colours only.

    Example:
        >>> legend_colors("{{tier}} {{reason}}")["host other"] == SHADES["host"]["pale"]
        True
    """
    return {name: style.color for name, style in legend_styles(legend).items()}
