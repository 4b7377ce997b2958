"""Grafana dashboards and Prometheus rules generated from the kvobs metric catalog.

Sources are Python (grafanalib for dashboards, plain data for rules); in a source
checkout ``kvobs dashboards --regenerate`` writes ``dashboards/generated/*.json``,
``dashboards/rules/*.yaml`` and their copies in the Helm chart. Those committed files
ship as package data; ``kvobs dashboards --out DIR`` hands them to a user without
importing anything here. Every query names only catalog metrics or kvobs recording
rules (:mod:`.promql` checks it).

Example:
    >>> from kvobs.dashboards import dashboard_json
    >>> board = dashboard_json("kvobs-tiers")
    >>> board["schemaVersion"] >= 42
    True
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .generate import (
        DASHBOARDS,
        RULE_FILES,
        dashboard_json,
        drift,
        render,
        source_root,
        write,
    )
    from .panels import Query

# grafanalib and PyYAML load on first use, so `kvobs demo` never needs them.
_LAZY = {"DASHBOARDS": "generate", "RULE_FILES": "generate", "dashboard_json": "generate",
         "drift": "generate", "render": "generate", "source_root": "generate",
         "write": "generate", "Query": "panels"}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)


__all__ = [
    "DASHBOARDS",
    "RULE_FILES",
    "Query",
    "dashboard_json",
    "drift",
    "render",
    "source_root",
    "write",
]
