"""Run every panel query of a generated dashboard over a time range.

The report reads the same JSON Grafana would import, fills in the template variables
as Grafana would with the given filters, and asks Prometheus for each target with
``query_range``. Any failure names the panel and the query: an unreachable server,
a PromQL error, or a query that returned no data. Queries on GPU-only (NVML) metrics
may be empty on a machine without a GPU; they are left out of the picture.

Example:
    >>> legend("{{src_tier}} → {{dst_tier}}", {"src_tier": "gpu", "dst_tier": "host"})
    'gpu → host'
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from kvobs.dashboards.promql import GPU_ONLY_METRICS, metric_names, substitute
from kvobs.errors import KvobsError
from kvobs.report.prometheus_api import PrometheusClient, QueryFailed, Series
from kvobs.tiers import tier_order

#: Queries (by legend) whose answer may be unknown, with the note drawn instead: the
#: host pool's net benefit has no value without a prefill cost or timed onloads, its
#: saving none without a prefill cost (:mod:`kvobs.report.verdict` says what to do).
MAY_BE_UNKNOWN = {
    "net": "net: unknown (no prefill cost known, or onloads without seconds)",
    "saves": "saves: unknown (no prefill cost known yet)",
    "prefill saved": "prefill saved: unknown (no prefill cost known yet)",
}


class ReportError(KvobsError):
    """The report cannot be drawn; the message names the panel and the query."""


@dataclass(frozen=True)
class TargetData:
    """The series one panel target returned, with their legends filled in."""

    legend_format: str
    expr: str
    series: list[Series]

    def labelled(self) -> list[tuple[str, Series]]:
        """(legend, series) pairs, legends rendered from each series' labels (a series
        without the labels its legend names is shown by its query, shortened: a whole
        query would not fit beside a plot)."""
        return [(legend(self.legend_format, s.labels) or _short(self.expr, 48).strip("'"), s)
                for s in self.series]


@dataclass(frozen=True)
class PanelData:
    """What one dashboard panel shows."""

    title: str
    kind: str
    unit: str
    description: str
    targets: list[TargetData]
    notes: list[str] = field(default_factory=list)
    #: The panel's field overrides as Grafana applies them: series name -> property id
    #: (``color``, ``custom.lineStyle``, ``custom.stacking``...) -> value.
    overrides: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: Whether the panel stacks its series (Grafana's ``custom.stacking.mode``).
    stacked: bool = False
    #: The variable Grafana repeats the panel over (one copy per value), if any.
    repeat: str | None = None
    #: The label an XY chart draws its curve over (its first series' x field).
    x_field: str | None = None


def repeated(panel: PanelData) -> list[tuple[str, PanelData]]:
    """The copies Grafana draws of ``panel``: one per value of its ``repeat`` variable
    (the label of that name), fastest tier first, titles filled in; ``[("", panel)]``
    for a panel that does not repeat.

    Example:
        >>> one = PanelData("Resident $tier", "timeseries", "bytes", "", [TargetData(
        ...     "{{tier}}", "q", [Series({"tier": "host"}, []), Series({"tier": "gpu"}, [])])],
        ...     repeat="tier")
        >>> [(value, copy.title, len(copy.targets[0].series)) for value, copy in repeated(one)]
        [('gpu', 'Resident gpu', 1), ('host', 'Resident host', 1)]
    """
    name = panel.repeat
    if not name:
        return [("", panel)]
    values = sorted({s.labels.get(name, "") for t in panel.targets for s in t.series},
                    key=lambda v: (tier_order(v), v) if name == "tier" else (0, v))
    return [(value, replace(
        panel, title=panel.title.replace(f"${name}", value), repeat=None,
        targets=[replace(t, series=[s for s in t.series if s.labels.get(name, "") == value])
                 for t in panel.targets]))
        for value in values]


def series_overrides(panel: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """A panel's ``byName`` field overrides: series name -> property id -> value.

    Example:
        >>> series_overrides({"fieldConfig": {"overrides": [{"matcher": {
        ...     "id": "byName", "options": "gpu"}, "properties": [
        ...     {"id": "color", "value": {"mode": "fixed", "fixedColor": "#56A64B"}}]}]}})
        {'gpu': {'color': {'mode': 'fixed', 'fixedColor': '#56A64B'}}}
    """
    result: dict[str, dict[str, Any]] = {}
    for override in panel.get("fieldConfig", {}).get("overrides", []):
        if override.get("matcher", {}).get("id") == "byName":
            props = result.setdefault(override["matcher"]["options"], {})
            props.update({p["id"]: p["value"] for p in override.get("properties", [])})
    return result


def is_stacked(panel: Mapping[str, Any]) -> bool:
    """Whether a panel stacks its series by default."""
    custom = panel.get("fieldConfig", {}).get("defaults", {}).get("custom", {})
    return bool(custom.get("stacking", {}).get("mode") == "normal")


def curve_x_field(panel: Mapping[str, Any]) -> str | None:
    """The field an XY chart's first series (its curve) takes x from, where the series
    mapping names it; None for any other panel.

    Example:
        >>> curve_x_field({"type": "xychart", "options": {"series": [
        ...     {"x": {"matcher": {"id": "byName", "options": "le"}}}]}})
        'le'
    """
    if panel.get("type") != "xychart":
        return None
    series = panel.get("options", {}).get("series") or [{}]
    matcher = series[0].get("x", {}).get("matcher", {})
    return matcher.get("options") if matcher.get("id") == "byName" else None


def legend(fmt: str, labels: Mapping[str, str]) -> str:
    """Grafana's ``{{label}}`` legend format filled from ``labels``."""
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt).strip()


def data_panels(dashboard: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The dashboard's panels that hold queries (rows left out, collapsed rows opened)."""
    panels: list[dict[str, Any]] = []
    for panel in dashboard.get("panels", []):
        if panel.get("type") == "row":
            panels.extend(panel.get("panels", []))
        else:
            panels.append(panel)
    return panels


def fetch_panels(client: PrometheusClient, dashboard: Mapping[str, Any],
                 variables: Mapping[str, str], start_s: float, end_s: float,
                 step_s: float) -> list[PanelData]:
    """Query every target of every panel; raise :class:`ReportError` on the first problem."""
    result = []
    for panel in data_panels(dashboard):
        title = panel.get("title", "?")
        targets: list[TargetData] = []
        notes: list[str] = []
        for target in panel.get("targets", []):
            expr = substitute(target["expr"], variables)
            try:
                series = client.query_range(expr, start_s, end_s, step_s)
            except QueryFailed as exc:
                raise ReportError(f"panel {title!r}, query {_short(expr)}: {exc}") from None
            series = [s for s in series if s.finite_samples]
            if not series:
                if target.get("legendFormat") in MAY_BE_UNKNOWN:
                    notes.append(MAY_BE_UNKNOWN[target["legendFormat"]])
                    continue
                if set(metric_names(expr)) <= GPU_ONLY_METRICS:
                    notes.append(f"{target.get('legendFormat') or expr}: no GPU (NVML) data")
                    continue
                raise ReportError(
                    f"panel {title!r}, query {_short(expr)}: no data between "
                    f"{_clock(start_s)} and {_clock(end_s)}; is Prometheus scraping a kvobs "
                    "exporter, and do the --job/--model/--instance filters match it?")
            targets.append(TargetData(target.get("legendFormat", ""), expr, series))
        defaults = panel.get("fieldConfig", {}).get("defaults", {})
        result.append(PanelData(title, panel["type"], defaults.get("unit", "short"),
                                panel.get("description", ""), targets, notes,
                                series_overrides(panel), is_stacked(panel),
                                panel.get("repeat") or None,
                                curve_x_field(panel)))
    return result


def _short(expr: str, limit: int = 160) -> str:
    flat = " ".join(expr.split())
    return repr(flat if len(flat) <= limit else flat[: limit - 3] + "...")


def _clock(unix_s: float) -> str:
    import datetime as _dt

    return _dt.datetime.fromtimestamp(unix_s, _dt.timezone.utc).strftime("%H:%M:%S UTC")
