"""A curve over a numeric label: Grafana's *trend* panel, e.g. hit ratio over cache size.

Prometheus returns one series per label value (``le="1024"``, ``le="128"``...), which a
stat panel draws as a bar each, in text order. A trend panel draws them as one line over
the label as a number: the query runs as an instant table, the label becomes a number,
the rows are sorted by it and the label is the x axis.

Further queries (``markers``) are sizes to mark on that axis (the engine's GPU pool,
GPU + host). Grafana's trend panel draws the first query alone (its x field is the
label, which the markers lack): the markers stay in the panel for readers that draw them
(``kvobs report`` draws each as a vertical line) and are listed in the description.

Example:
    >>> from dashboards.panels import Query
    >>> panel = trend_curve("What-if", "Hit ratio per size.", "percentunit",
    ...                     Query("curve", "hit ratio"), "le", "cache size (blocks)",
    ...                     [Query("gpu_size", "GPU")])
    >>> [t.refId for t in panel.targets], panel.to_json_data()["options"]["xField"]
    (['A', 'B'], 'le')
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attr
from grafanalib.core import Panel, Target

from .panels import DATASOURCE, Query

#: refId of the curve's query; the markers' follow (B, C...).
CURVE_REF = "A"


@attr.s
class TrendCurve(Panel):  # type: ignore[misc]  # grafanalib is untyped
    """Grafana's trend panel (a line over a numeric field), for one labelled curve."""

    unit: str = attr.ib(default="percentunit")
    x_label: str = attr.ib(default="le")
    x_title: str = attr.ib(default="")

    def to_json_data(self) -> dict[str, Any]:
        line = {
            "drawStyle": "line", "lineWidth": 2, "lineInterpolation": "linear",
            "showPoints": "always", "pointSize": 6, "fillOpacity": 10,
            "axisPlacement": "auto", "axisLabel": "",
            "scaleDistribution": {"type": "linear"}, "spanNulls": True,
            "hideFrom": {"legend": False, "tooltip": False, "viz": False},
        }
        return self.panel_json(  # type: ignore[no-any-return]
            {
                "fieldConfig": {
                    "defaults": {"unit": self.unit, "min": 0,
                                 **({"max": 1} if self.unit == "percentunit" else {}),
                                 "color": {"mode": "fixed", "fixedColor": "blue"},
                                 "custom": line},
                    "overrides": [{
                        "matcher": {"id": "byName", "options": self.x_label},
                        "properties": [
                            {"id": "unit", "value": "short"},
                            {"id": "displayName", "value": self.x_title},
                            {"id": "custom.scaleDistribution",
                             "value": {"type": "log", "log": 2}},
                        ],
                    }],
                },
                "options": {
                    "xField": self.x_label,
                    "legend": {"showLegend": True, "displayMode": "list",
                               "placement": "bottom", "calcs": []},
                    "tooltip": {"mode": "single", "sort": "none"},
                },
                "transformations": [
                    {"id": "filterByRefId", "options": {"include": CURVE_REF}},
                    {"id": "convertFieldType", "options": {"conversions": [
                        {"targetField": self.x_label, "destinationType": "number"}]}},
                    {"id": "sortBy", "options": {"sort": [{"field": self.x_label}]}},
                    {"id": "organize", "options": {"excludeByName": {"Time": True}}},
                ],
                "type": "trend",
            }
        )


def trend_curve(title: str, description: str, unit: str, curve: Query, x_label: str,
                x_title: str, markers: Sequence[Query] = (), *, width: int = 12) -> TrendCurve:
    """``curve``'s series as one line over their ``x_label`` label (as a number, sorted),
    with ``markers`` (single values on that axis) as further queries."""
    targets = [Target(expr=q.expr, legendFormat=q.legend, refId=chr(ord(CURVE_REF) + i),
                      format="table", instant=True, datasource=DATASOURCE)
               for i, q in enumerate([curve, *markers])]
    fields: dict[str, Any] = {
        "title": title, "description": description, "dataSource": DATASOURCE,
        "targets": targets, "unit": unit, "x_label": x_label, "x_title": x_title,
        "span": width,
    }
    return TrendCurve(**fields)
