"""A curve over a numeric label with sizes marked on it: Grafana's *XY chart* panel.

Prometheus returns one series per label value (``le="1024"``, ``le="128"``...), which a
stat panel draws as a bar each, in text order. Here the curve's query runs as an instant
table, the label becomes a number, the rows are sorted by it, and the XY chart's first
series draws them as one line: x = the label, y = the value.

Each marker (the engine's GPU pool, all its tiers) is a size on that axis, drawn as a
vertical line across the 0-1 value axis: its query returns the size twice, on rows
labelled ``y="0"`` and ``y="1"`` (:func:`vertical_line`), and a series of its own draws
that frame with x = the value, y = the label. (Grafana's trend panel draws one frame,
hence one query, only; an XY chart maps a series to each query's frame.)

What Grafana's XY chart does with the JSON, and so what this module writes:

* a manual series picks its frame by index only: the queries' order (``A``, ``B``...);
* the x axis (range, log scale, label) is configured from the first series' x field: the
  curve's label, with the axis overrides (no display name: a series finds its fields
  after the overrides are applied, and older Grafana matches a name to display names
  only);
* each value axis is keyed by its unit: the curve's value and the markers' ``y`` share
  the panel's unit and its 0-1 range;
* series names lose the words every name starts or ends with: give the curve and the
  markers names that share no first or last word;
* a panel without ``pluginVersion`` is migrated as a pre-10.4 XY chart: it carries the
  pinned Grafana version.

Example:
    >>> from dashboards.panels import Query
    >>> panel = xy_curve("What-if", "Hit ratio per size.", "percentunit",
    ...                  Query("curve", "hit ratio"), "le", "cache size (blocks)",
    ...                  [Marker(Query("gpu_size", "GPU"), "GPU", "gpu", "dash")])
    >>> data = panel.to_json_data()
    >>> [t.refId for t in panel.targets], data["type"], data["options"]["mapping"]
    (['A', 'B'], 'xychart', 'manual')
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import attr
from grafanalib.core import Panel, Target

from kvobs.palette import LINES, tier_color

from .modern import GRAFANA_VERSION
from .panels import DATASOURCE, Query

#: refId of the curve's query; the markers' follow (B, C...).
CURVE_REF = "A"

#: Label of a marker's two rows: the ends of its vertical line on the 0-1 value axis.
MARKER_Y = "y"

#: Where a vertical marker line starts and ends on the value axis.
LINE_ENDS = ("0", "1")

#: Width of a marker line (Grafana ``custom.lineWidth``), as the report's markers.
MARKER_LINE_WIDTH = 2


@dataclass(frozen=True)
class Marker:
    """A size to mark on the curve's x axis.

    ``query`` returns the size (one value; its legend names it in ``kvobs report``),
    ``name`` is its name in the Grafana legend, ``tier`` the palette tier it takes its
    colour from and ``line`` its dash (a key of :data:`kvobs.palette.LINES`).
    """

    query: Query
    name: str
    tier: str
    line: str


def ref_id(index: int) -> str:
    """refId of the panel's ``index``-th query (0: the curve)."""
    return chr(ord(CURVE_REF) + index)


def value_column(ref: str) -> str:
    """Grafana's name of query ``ref``'s value column, as a field name regex (Grafana
    anchors it): its Prometheus table format says ``Value``, or ``Value #<refId>`` when
    the panel has several queries."""
    return f"Value( #{ref})?"


def vertical_line(size: str) -> str:
    """PromQL: ``size`` (one value) on two rows, ``y="0"`` and ``y="1"``.

    Example:
        >>> vertical_line("sum(m)")
        'label_replace(sum(m), "y", "0", "", "") or label_replace(sum(m), "y", "1", "", "")'
    """
    return " or ".join(f'label_replace({size}, "{MARKER_Y}", "{end}", "", "")'
                       for end in LINE_ENDS)


def _matcher(kind: str, options: Any) -> dict[str, Any]:
    return {"matcher": {"id": kind, "options": options}}


def _series(curve_name: str, x_label: str, markers: Sequence[Marker]) -> list[dict[str, Any]]:
    """The XY chart's manual series: the curve over ``x_label``, then one vertical line
    per marker (frame i is query i)."""
    curve = {"name": {"fixed": curve_name}, "frame": _matcher("byIndex", 0),
             "x": _matcher("byName", x_label), "y": _matcher("byRegexp", value_column(CURVE_REF))}
    lines = [{"name": {"fixed": marker.name}, "frame": _matcher("byIndex", i),
              "x": _matcher("byRegexp", value_column(ref_id(i))),
              "y": _matcher("byName", MARKER_Y)}
             for i, marker in enumerate(markers, start=1)]
    return [curve, *lines]


def _prop(prop_id: str, value: Any) -> dict[str, Any]:
    return {"id": prop_id, "value": value}


def _overrides(unit: str, x_label: str, x_title: str,
               markers: Sequence[Marker]) -> list[dict[str, Any]]:
    """The x axis on the curve's label; each marker's colour and dash (its x in blocks);
    the 0-1 range on every value the value axis draws. Later overrides win."""
    value_range = ([_prop("min", 0), _prop("max", 1)] if unit == "percentunit" else [])
    x_axis = {**_matcher("byName", x_label), "properties": [
        _prop("unit", "short"), _prop("custom.axisLabel", x_title),
        _prop("custom.scaleDistribution", {"type": "log", "log": 2})]}
    curve = {**_matcher("byRegexp", value_column(CURVE_REF)), "properties": value_range}
    lines = [{**_matcher("byFrameRefID", ref_id(i)), "properties": [
        _prop("unit", "short"),
        _prop("color", {"mode": "fixed", "fixedColor": tier_color(marker.tier)}),
        _prop("custom.show", "lines"), _prop("custom.lineStyle", LINES[marker.line]),
        _prop("custom.lineWidth", MARKER_LINE_WIDTH)]}
        for i, marker in enumerate(markers, start=1)]
    ends = {**_matcher("byName", MARKER_Y), "properties": [_prop("unit", unit), *value_range]}
    return [x_axis, curve, *lines, *([ends] if markers else [])]


def _transformations(x_label: str, markers: Sequence[Marker]) -> list[dict[str, Any]]:
    """Labels to numbers, the curve's rows in x order, no time column."""
    numbers = [x_label, *([MARKER_Y] if markers else [])]
    return [
        {"id": "convertFieldType", "options": {"conversions": [
            {"targetField": name, "destinationType": "number"} for name in numbers]}},
        {"id": "sortBy", "options": {"sort": [{"field": x_label}]}},
        {"id": "organize", "options": {"excludeByName": {"Time": True}}},
    ]


@attr.s
class XYCurve(Panel):  # type: ignore[misc]  # grafanalib is untyped
    """Grafana's XY chart: one labelled curve, and vertical lines at marked sizes."""

    unit: str = attr.ib(default="percentunit")
    x_label: str = attr.ib(default="le")
    x_title: str = attr.ib(default="")
    curve_name: str = attr.ib(default="")
    markers: list[Marker] = attr.ib(factory=list)

    def to_json_data(self) -> dict[str, Any]:
        points = {
            "show": "points+lines", "pointShape": "circle", "pointSize": {"fixed": 6},
            "pointStrokeWidth": 1, "fillOpacity": 50, "lineWidth": 2,
            "lineStyle": LINES["solid"], "axisPlacement": "auto",
            "axisLabel": self.curve_name, "scaleDistribution": {"type": "linear"},
            "hideFrom": {"legend": False, "tooltip": False, "viz": False},
        }
        return self.panel_json(  # type: ignore[no-any-return]
            {
                "fieldConfig": {
                    "defaults": {"unit": self.unit,
                                 "color": {"mode": "fixed", "fixedColor": tier_color("host")},
                                 "custom": points},
                    "overrides": _overrides(self.unit, self.x_label, self.x_title,
                                            self.markers),
                },
                "options": {
                    "mapping": "manual",
                    "series": _series(self.curve_name, self.x_label, self.markers),
                    "legend": {"showLegend": True, "displayMode": "list",
                               "placement": "bottom", "calcs": []},
                    "tooltip": {"mode": "single", "sort": "none"},
                },
                "transformations": _transformations(self.x_label, self.markers),
                "pluginVersion": GRAFANA_VERSION,
                "type": "xychart",
            }
        )


def xy_curve(title: str, description: str, unit: str, curve: Query, x_label: str,
             x_title: str, markers: Sequence[Marker] = (), *, width: int = 12) -> XYCurve:
    """``curve``'s series as one line over their ``x_label`` label (as a number, sorted),
    each of ``markers`` a vertical line at its size on that axis."""
    queries = [curve, *(Query(vertical_line(m.query.expr), m.query.legend) for m in markers)]
    targets = [Target(expr=q.expr, legendFormat=q.legend, refId=ref_id(i), format="table",
                      instant=True, datasource=DATASOURCE)
               for i, q in enumerate(queries)]
    fields: dict[str, Any] = {
        "title": title, "description": description, "dataSource": DATASOURCE,
        "targets": targets, "unit": unit, "x_label": x_label, "x_title": x_title,
        "curve_name": curve.legend, "markers": list(markers), "span": width,
    }
    return XYCurve(**fields)
