"""Grafana dashboards and Prometheus rules generated from the kvobs metric catalog.

Sources are Python (grafanalib for dashboards, plain data for rules); ``kvobs
dashboards`` writes ``dashboards/generated/*.json``, ``dashboards/rules/*.yaml`` and
their copies in the Helm chart. Every query names only catalog metrics or kvobs
recording rules (:mod:`.promql` checks it).

Example:
    >>> from kvobs.dashboards import dashboard_json
    >>> board = dashboard_json("kvobs-tiers")
    >>> board["schemaVersion"] >= 42
    True
"""

from .generate import DASHBOARDS, RULE_FILES, dashboard_json, drift, render, source_root, write
from .panels import Query

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
