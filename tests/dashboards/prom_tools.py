"""Finding Prometheus's binaries for the dashboard and end-to-end tests.

``scripts/deps/prometheus.sh`` installs them into ``$REPO/.tools/bin``. Missing binaries
skip a test locally and fail it when ``CI`` is set: CI must never pass by skipping.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def find_prometheus_tool(name: str) -> Path:
    """``prometheus`` or ``promtool`` from ``$REPO/.tools/bin`` or PATH."""
    local = REPO / ".tools" / "bin" / name
    if local.is_file() and os.access(local, os.X_OK):
        return local
    found = shutil.which(name)
    if found:
        return Path(found)
    message = f"{name} not found in {local.parent} or PATH; run `bash scripts/deps/prometheus.sh`"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)
