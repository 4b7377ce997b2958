"""The report's colours: :mod:`kvobs.palette`, the one table shared with ``kvobs top``
and the dashboards (this name stays for existing imports).

Example:
    >>> from kvobs.palette import TIERS
    >>> series_color({"tier": "gpu"}) == TIERS["gpu"]
    True
"""

from __future__ import annotations

from kvobs.palette import (
    BROKEN_LINE_WIDTH,
    CACHED,
    DIRECTIONS,
    LINES,
    NEUTRAL,
    OTHERS,
    OUTCOMES,
    PALETTE_LABELS,
    REASONS,
    SHADES,
    TIERS,
    Style,
    dashed,
    direction_color,
    legend_colors,
    legend_styles,
    series_color,
    series_style,
    tier_color,
)

__all__ = ["BROKEN_LINE_WIDTH", "CACHED", "DIRECTIONS", "LINES", "NEUTRAL", "OTHERS",
           "OUTCOMES", "PALETTE_LABELS", "REASONS", "SHADES", "TIERS", "Style", "dashed",
           "direction_color", "legend_colors", "legend_styles", "series_color", "series_style",
           "tier_color"]
