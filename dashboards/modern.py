"""Turn grafanalib's JSON into the current Grafana dashboard model.

grafanalib 0.7.1 writes schemaVersion 12 with fields that Grafana removed years ago
(``rows``, ``style``, ``sharedCrosshair``, string data sources, Graphite-era target keys)
and leaves out fields current panels require (the stat panel's ``wideLayout``...). The
rules below rewrite the output so it validates against the JSON schema generated from
``@grafana/schema`` (see ``schema/``) and Grafana loads it without migrating anything.

Example:
    >>> panel = {"type": "text", "datasource": "${datasource}", "span": 6, "height": None}
    >>> modern_panel(panel)
    {'type': 'text', 'datasource': {'type': 'prometheus', 'uid': '${datasource}'}}
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from grafanalib._gen import DashboardEncoder
from grafanalib.core import Dashboard

SCHEMA_DIR = Path(__file__).parent / "schema"

_SOURCE: dict[str, Any] = json.loads((SCHEMA_DIR / "source.json").read_text())

#: Grafana's current dashboard schema version, as pinned in ``schema/source.json``.
SCHEMA_VERSION: int = _SOURCE["schemaVersion"]

#: The Grafana release the schemas are pinned to (``@grafana/schema``'s version): the
#: ``pluginVersion`` of a panel whose options Grafana must not migrate.
GRAFANA_VERSION: str = _SOURCE["version"]

_LEGACY_DASHBOARD_KEYS = ("__inputs", "hideControls", "rows", "sharedCrosshair", "style", "gnetId")
_LEGACY_PANEL_KEYS = ("editable", "error", "height", "minSpan", "span", "thresholds",
                      "hideTimeOverride", "transparent", "maxDataPoints")
_LEGACY_TARGET_KEYS = ("query", "target", "metric", "step", "intervalFactor", "hide", "interval")
_LEGACY_VARIABLE_KEYS = ("useTags", "tagsQuery", "tagValuesQuery", "auto", "auto_min",
                         "auto_count")
_STAT_DEFAULTS = {"percentChangeColorMode": "standard", "showPercentChange": False,
                  "wideLayout": True}
_BUILTIN_ANNOTATION = {
    "builtIn": 1,
    "datasource": {"type": "grafana", "uid": "-- Grafana --"},
    "enable": True,
    "hide": True,
    "iconColor": "rgba(0, 211, 255, 1)",
    "name": "Annotations & Alerts",
    "type": "dashboard",
}


def datasource_ref(value: Any) -> Any:
    """A data source string (``${datasource}``) as the object current Grafana expects."""
    if isinstance(value, str):
        return {"type": "prometheus", "uid": value}
    return value


def _drop_none(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _drop_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_none(v) for v in value]
    return value


def modern_target(target: dict[str, Any]) -> dict[str, Any]:
    """A Prometheus query target without Graphite-era keys, as the query editor saves it."""
    out = {k: v for k, v in target.items() if k not in _LEGACY_TARGET_KEYS}
    out["datasource"] = datasource_ref(out.get("datasource"))
    out["editorMode"] = "code"
    out["range"] = not out.get("instant", False)
    if out.get("format") == "time_series":
        del out["format"]
    return out


def modern_panel(panel: dict[str, Any]) -> dict[str, Any]:
    """One panel (or row) in the current model."""
    out = {k: v for k, v in _drop_none(panel).items() if k not in _LEGACY_PANEL_KEYS}
    for key in ("links", "transformations"):
        if out.get(key) == []:
            del out[key]
    if "datasource" in out:
        out["datasource"] = datasource_ref(out["datasource"])
    if "targets" in out:
        out["targets"] = [modern_target(t) for t in out["targets"]]
    defaults = out.get("fieldConfig", {}).get("defaults")
    if defaults is not None:
        steps = defaults.get("thresholds", {}).get("steps")
        if not steps:  # grafanalib writes [] or "": Grafana wants the base step
            defaults["thresholds"] = {"mode": "absolute",
                                      "steps": [{"color": "green", "value": None}]}
        out["fieldConfig"].setdefault("overrides", [])
    if out.get("type") == "stat":
        out["options"] = {**_STAT_DEFAULTS, **out["options"]}
    if out.get("type") == "timeseries":
        out["options"]["legend"] = {"showLegend": True, **out["options"]["legend"]}
    if out.get("type") == "row":
        out.pop("targets", None)
        out.pop("fieldConfig", None)
        out["panels"] = [modern_panel(p) for p in out.get("panels", [])]
    return out


def modern_variable(variable: dict[str, Any], description: str | None) -> dict[str, Any]:
    """One template variable without the Graphite tag fields."""
    out = {k: v for k, v in _drop_none(variable).items() if k not in _LEGACY_VARIABLE_KEYS}
    out["current"] = {k: v for k, v in out.get("current", {}).items() if k != "tags"}
    if out["current"].get("value") == "$__all":
        out["current"] |= {"text": "All", "selected": True}
    if out["current"].get("text") is None:
        out.pop("current")
    if "datasource" in out:
        out["datasource"] = datasource_ref(out["datasource"])
    if description:
        out["description"] = description
    return out


def to_json(dashboard: Dashboard, variable_help: dict[str, str]) -> dict[str, Any]:
    """The dashboard as a dict of the current Grafana model (schemaVersion pinned)."""
    raw = json.loads(json.dumps(dashboard.to_json_data(), cls=DashboardEncoder))
    out = {k: v for k, v in raw.items() if k not in _LEGACY_DASHBOARD_KEYS}
    out["schemaVersion"] = SCHEMA_VERSION
    out["id"] = None
    out["annotations"] = {"list": [_BUILTIN_ANNOTATION, *raw["annotations"]["list"]]}
    out["panels"] = [modern_panel(p) for p in raw["panels"]]
    out["templating"] = {
        "list": [modern_variable(v, variable_help.get(v["name"]))
                 for v in raw["templating"]["list"]]
    }
    out["timepicker"] = {"refresh_intervals": raw["timepicker"]["refresh_intervals"]}
    out["fiscalYearStartMonth"] = 0
    return out
