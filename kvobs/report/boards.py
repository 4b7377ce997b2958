"""The generated dashboards as kvobs ships them: JSON package data, no grafanalib.

``kvobs dashboards`` writes ``dashboards/generated/*.json`` from the Python sources; the
wheel ships those files as package data of ``kvobs.dashboards`` (``setup.py``), so the
report reads exactly what Grafana would import, in a checkout and in an installed
kvobs alike. A test keeps the built wheel's copy identical to the committed one.

Example:
    >>> board = dashboard_json("kvobs-tiers")
    >>> board["uid"], board["schemaVersion"] >= 42
    ('kvobs-tiers', True)
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

from kvobs.errors import KvobsError

#: Package and folder of the shipped dashboard JSON.
PACKAGE = "kvobs.dashboards"
FOLDER = "generated"


def dashboard_stems() -> list[str]:
    """File stems of the shipped dashboards (``kvobs-tiers``, ...)."""
    folder = resources.files(PACKAGE) / FOLDER
    return sorted(entry.name.removesuffix(".json") for entry in folder.iterdir()
                  if entry.name.endswith(".json"))


def dashboard_json(stem: str) -> dict[str, Any]:
    """The shipped JSON of dashboard ``stem``.

    Raises:
        KvobsError: the file is missing from this installation (a broken install).
    """
    entry = resources.files(PACKAGE) / FOLDER / f"{stem}.json"
    try:
        board: dict[str, Any] = json.loads(entry.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise KvobsError(
            f"dashboard {stem!r} is not part of this kvobs installation "
            f"({', '.join(dashboard_stems()) or 'none shipped'}): reinstall kvobs"
        ) from None
    return board
