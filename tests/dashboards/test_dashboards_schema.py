"""Every dashboard validates against the JSON schema generated from npm @grafana/schema.

The dashboard model leaves a panel's ``options`` and ``fieldConfig.defaults.custom``
free-form; each panel type's own generated schema makes those strict too.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from grafanalib._gen import DashboardEncoder

from kvobs.dashboards import tiers
from kvobs.report.fetch import data_panels

SCHEMA_DIR = Path(__file__).resolve().parents[2] / "dashboards" / "schema"
SOURCE = json.loads((SCHEMA_DIR / "source.json").read_text())


@cache
def validator(name: str) -> jsonschema.Draft7Validator:
    schema = json.loads((SCHEMA_DIR / name).read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


def errors(name: str, document: Any) -> list[str]:
    return [
        f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
        for e in validator(name).iter_errors(document)
    ]


def test_schema_is_pinned() -> None:
    assert SOURCE["package"] == "@grafana/schema"
    assert SOURCE["version"] == "13.2.3"
    assert SOURCE["schemaVersion"] >= 41
    script = (SCHEMA_DIR / "regenerate.sh").read_text()
    assert f'GRAFANA_SCHEMA_VERSION="${{GRAFANA_SCHEMA_VERSION:-{SOURCE["version"]}}}"' in script
    assert SOURCE["generator"] == "ts-json-schema-generator@2.10.0"
    assert 'GENERATOR_VERSION="${GENERATOR_VERSION:-2.10.0}"' in script


def test_dashboard_validates(board: dict[str, Any]) -> None:
    assert errors("dashboard.schema.json", board) == []
    assert board["schemaVersion"] == SOURCE["schemaVersion"]


def test_panel_options_validate(board: dict[str, Any]) -> None:
    for panel in data_panels(board):
        kind = panel["type"]
        assert kind in SOURCE["panelTypes"], f"{panel['title']!r}: no pinned schema for {kind}"
        assert errors(f"panels/{kind}.options.schema.json", panel["options"]) == [], panel["title"]
        custom = panel["fieldConfig"]["defaults"].get("custom", {})
        assert errors(f"panels/{kind}.fieldconfig.schema.json", custom) == [], panel["title"]


def test_no_legacy_fields(board: dict[str, Any]) -> None:
    text = json.dumps(board)
    for legacy in (
        '"rows"',
        '"sharedCrosshair"',
        '"style"',
        '"hideControls"',
        '"span"',
        '"intervalFactor"',
        '"graph"',
    ):
        assert legacy not in text, legacy


def test_grafanalib_defaults_do_not_validate() -> None:
    """The schema is strict: grafanalib's own output (schemaVersion 12) is rejected."""
    raw = json.loads(json.dumps(tiers.dashboard().to_json_data(), cls=DashboardEncoder))
    assert raw["schemaVersion"] == 12
    found = "\n".join(errors("dashboard.schema.json", raw))
    assert "Additional properties are not allowed" in found
    assert "'rows'" in found and "'sharedCrosshair'" in found


@pytest.mark.parametrize("kind", ["timeseries", "stat", "heatmap", "xychart"])
def test_panel_schemas_reject_unknown_options(kind: str) -> None:
    assert errors(f"panels/{kind}.options.schema.json", {"not_an_option": 1})
