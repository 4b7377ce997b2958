"""The generated dashboards and rules as kvobs ships them: package data, no grafanalib.

``kvobs dashboards --regenerate`` writes ``dashboards/generated/*.json`` and
``dashboards/rules/*.yaml`` from the Python sources; the wheel ships those files as
package data of ``kvobs.dashboards`` (``setup.py``), so the report reads exactly what
Grafana would import and ``kvobs dashboards --out`` hands out exactly what is committed,
in a checkout and in an installed kvobs alike. A test keeps the built wheel's copy
identical to the committed one.

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

#: Folder of the shipped Prometheus recording and alert rules.
RULES_FOLDER = "rules"


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


def shipped_files() -> dict[str, bytes]:
    """Every shipped dashboard and rule file: ``dashboards/<stem>.json`` and
    ``rules/<name>.rules.yaml`` -> its bytes, as ``kvobs dashboards --out`` writes them.

    Example:
        >>> sorted(shipped_files())[-1]
        'rules/kvobs-recording.rules.yaml'
    """
    root = resources.files(PACKAGE)
    files: dict[str, bytes] = {}
    for folder, target, suffix in ((FOLDER, "dashboards", ".json"),
                                   (RULES_FOLDER, "rules", ".rules.yaml")):
        for entry in (root / folder).iterdir():
            if entry.name.endswith(suffix):
                files[f"{target}/{entry.name}"] = entry.read_bytes()
    if not files:
        raise KvobsError("this kvobs installation ships no dashboards or rules: reinstall kvobs")
    return dict(sorted(files.items()))
