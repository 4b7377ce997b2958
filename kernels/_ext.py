"""The optional C extension, or None where it was not built (no C compiler at install).

``KVOBS_NATIVE=0`` leaves it unloaded: every part then runs its pure-Python (or torch)
path, the reference the C paths are tested against; the mutation check
(``scripts/mutation_check.py``) judges its mutants of those Python paths so.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType


def _load() -> ModuleType | None:
    if os.environ.get("KVOBS_NATIVE", "").strip() == "0":
        return None
    try:
        return importlib.import_module("kvobs.kernels._native")
    except ImportError:  # no C compiler at install time: the torch path runs instead
        return None


native: ModuleType | None = _load()
