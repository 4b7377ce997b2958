"""Finding Prometheus's binaries for the dashboard and end-to-end tests.

``scripts/deps/prometheus.sh`` installs them into ``$REPO/.tools/bin``. Missing binaries
skip a test locally and fail it when ``CI`` is set: CI must never pass by skipping.
"""

from __future__ import annotations

from pathlib import Path

from tests.required import REPO, find_tool

__all__ = ["REPO", "find_prometheus_tool"]


def find_prometheus_tool(name: str) -> Path:
    """``prometheus`` or ``promtool`` from ``$REPO/.tools/bin`` or PATH."""
    return find_tool(name, "scripts/deps/prometheus.sh")
