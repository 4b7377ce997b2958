"""Panel builders: grafanalib panels with a unit, a how-to-read description and queries.

Each builder takes what a reader needs (title, description, unit, queries) and leaves
the visual defaults to one place. :func:`layout` turns sections of panels into rows with
grid positions, so dashboards are written as lists, never as coordinates. Series get
the colours of :mod:`kvobs.palette` (one per tier, outcome and direction, as in
``kvobs report`` and ``kvobs top``) through per-panel overrides: a tier's states and
eviction reasons are shades (and dashes) of its colour, and occupancy stacks per tier
(one stacking group per tier, capacity as an unstacked dashed reference line).

Example:
    >>> panel = timeseries("Lookups", "Lookups per second.", "short",
    ...                    [Query("sum(rate(kvobs_lookups_total[5m]))", "lookups")])
    >>> panel.title, panel.unit
    ('Lookups', 'short')
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import attr
from grafanalib.core import (
    Dashboard,
    GridPos,
    Panel,
    Repeat,
    RowPanel,
    Stat,
    Target,
    Templating,
    Time,
    TimeSeries,
)

from kvobs.palette import BROKEN_LINE_WIDTH, LINES, legend_series

from .variables import templates

#: Every panel reads the data source chosen in the ``datasource`` variable.
DATASOURCE = "${datasource}"

_GRID_WIDTH = 24

#: Copies of a repeated panel per row.
_MAX_PER_ROW = 4


@dataclass(frozen=True)
class Query:
    """One PromQL query of a panel and the legend of the series it returns."""

    expr: str
    legend: str = ""


def _targets(queries: Sequence[Query], fmt: str = "time_series") -> list[Target]:
    return [
        Target(expr=q.expr, legendFormat=q.legend, refId=chr(ord("A") + i), format=fmt,
               datasource=DATASOURCE)
        for i, q in enumerate(queries)
    ]


def color_overrides(queries: Sequence[Query], *, lines: bool = True,
                    stack_per_tier: bool = False) -> list[dict[str, Any]]:
    """Field overrides giving each series the palette colour of its legend name; with
    ``lines``, its palette line (dashed p99, failed and capacity lines, a dash per
    eviction reason); with ``stack_per_tier``, a stacking group per tier, reference
    (dashed) lines left out of the stack."""
    overrides: list[dict[str, Any]] = []
    named: set[str] = set()
    for query in queries:
        for name, labels, style in legend_series(query.legend):
            if name in named:  # two queries with one legend (a state each): one override
                continue
            named.add(name)
            properties: list[dict[str, Any]] = [
                {"id": "color", "value": {"mode": "fixed", "fixedColor": style.color}}]
            if lines and style.line != "solid":  # broken lines a little wider, to read
                properties += [{"id": "custom.lineStyle", "value": LINES[style.line]},
                               {"id": "custom.lineWidth", "value": BROKEN_LINE_WIDTH}]
            if stack_per_tier and "tier" in labels:
                if style.line == "solid":
                    properties.append({"id": "custom.stacking",
                                       "value": {"mode": "normal", "group": labels["tier"]}})
                else:
                    properties += [{"id": "custom.stacking",
                                    "value": {"mode": "none", "group": "A"}},
                                   {"id": "custom.fillOpacity", "value": 0}]
            overrides.append({"matcher": {"id": "byName", "options": name},
                              "properties": properties})
    return overrides


def timeseries(
    title: str,
    description: str,
    unit: str,
    queries: Sequence[Query],
    *,
    axis_label: str = "",
    stacked: bool = False,
    stack_per_tier: bool = False,
    ratio: bool = False,
    repeat: str | None = None,
    width: int = 12,
) -> TimeSeries:
    """A time series panel; ``ratio`` pins the axis to 0..1, ``stacked`` stacks series,
    ``stack_per_tier`` stacks each tier's series on their own (occupancy by state);
    ``repeat`` names a variable to draw one copy per value of, side by side (give such a
    panel the whole row: Grafana lays the copies out from its left edge)."""
    stacked = stacked or stack_per_tier
    return TimeSeries(
        title=title,
        description=description,
        dataSource=DATASOURCE,
        targets=_targets(queries),
        unit=unit,
        axisLabel=axis_label,
        fillOpacity=30 if stacked else 10,
        stacking={"mode": "normal", "group": "A"} if stacked else {"mode": "none", "group": "A"},
        valueMin=0,
        valueMax=1 if ratio else None,
        legendDisplayMode="table",
        legendCalcs=["lastNotNull", "max"],
        tooltipMode="multi",
        tooltipSort="desc",
        overrides=color_overrides(queries, stack_per_tier=stack_per_tier),
        repeat=Repeat("h", repeat, _MAX_PER_ROW) if repeat else Repeat(),
        span=width,
    )


def stat(title: str, description: str, unit: str, queries: Sequence[Query],
         *, width: int = 6) -> Stat:
    """A stat panel showing the latest value of each series."""
    return Stat(
        title=title,
        description=description,
        dataSource=DATASOURCE,
        targets=_targets(queries),
        format=unit,
        reduceCalc="lastNotNull",
        graphMode="area",
        colorMode="none",
        textMode="value_and_name",
        noValue="no data",
        overrides=color_overrides(queries, lines=False),
        span=width,
    )


@attr.s
class Heatmap(Panel):  # type: ignore[misc]  # grafanalib is untyped
    """A Grafana 10+ heatmap of pre-bucketed Prometheus histogram rates.

    grafanalib 0.7.1 only knows the legacy (Angular) heatmap, whose JSON current
    Grafana migrates on load; this emits the current options directly.
    """

    unit: str = attr.ib(default="s")
    scheme: str = attr.ib(default="Oranges")

    def to_json_data(self) -> dict[str, Any]:
        return self.panel_json(  # type: ignore[no-any-return]
            {
                "fieldConfig": {
                    "defaults": {
                        "unit": self.unit,
                        "custom": {
                            "hideFrom": {"legend": False, "tooltip": False, "viz": False},
                            "scaleDistribution": {"type": "linear"},
                        },
                    },
                    "overrides": [],
                },
                "options": {
                    "calculate": False,
                    "cellGap": 1,
                    "color": {
                        "exponent": 0.5, "fill": "dark-orange", "mode": "scheme",
                        "reverse": False, "scale": "exponential", "scheme": self.scheme,
                        "steps": 64,
                    },
                    "exemplars": {"color": "rgba(255,0,255,0.7)"},
                    "filterValues": {"le": 1e-9},
                    "legend": {"show": True},
                    "rowsFrame": {"layout": "auto", "value": "transfers/s"},
                    "showValue": "never",
                    "tooltip": {"mode": "single", "showColorScale": True, "yHistogram": True},
                    "yAxis": {"axisPlacement": "left", "reverse": False, "unit": self.unit},
                },
                "type": "heatmap",
            }
        )


def heatmap(title: str, description: str, unit: str, query: Query, *, width: int = 12) -> Heatmap:
    """A heatmap of a histogram's ``sum by (le) (rate(..._bucket[...]))``."""
    fields: dict[str, Any] = {
        "title": title, "description": description, "dataSource": DATASOURCE,
        "targets": _targets([query], fmt="heatmap"), "unit": unit, "span": width,
    }
    return Heatmap(**fields)


@dataclass(frozen=True)
class Section:
    """A titled row of panels; a panel's ``span`` is its width out of 24 columns."""

    title: str
    panels: Sequence[Panel]


def layout(sections: Sequence[Section], height: int = 8) -> list[Panel]:
    """Rows and panels with grid positions and ids, left to right, top to bottom."""
    result: list[Panel] = []
    y = 0
    next_id = 1
    for section in sections:
        result.append(RowPanel(title=section.title, id=next_id,
                               gridPos=GridPos(h=1, w=_GRID_WIDTH, x=0, y=y)))
        next_id += 1
        y += 1
        x = 0
        for panel in section.panels:
            width = panel.span or 12
            if x + width > _GRID_WIDTH:
                x, y = 0, y + height
            result.append(attr.evolve(panel, id=next_id, span=None,
                                      gridPos=GridPos(h=height, w=width, x=x, y=y)))
            next_id += 1
            x += width
        y += height
    return result


def kvobs_dashboard(*, title: str, uid: str, description: str, tags: Sequence[str],
                    refresh: str, time_from: str, sections: Sequence[Section]) -> Dashboard:
    """A kvobs dashboard: the shared frame (variables, tooltip, time zone) around ``sections``."""
    return Dashboard(
        title=title,
        uid=uid,
        description=description,
        tags=["kvobs", "kv-cache", *tags],
        timezone="browser",
        refresh=refresh,
        graphTooltip=1,
        time=Time(time_from, "now"),
        templating=Templating(list=templates(
            {p.repeat.variable for s in sections for p in s.panels if p.repeat.variable})),
        panels=layout(sections),
    )
