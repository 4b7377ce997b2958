"""The optional C extension, or None where it was not built (no C compiler at install)."""

from __future__ import annotations

import importlib
from types import ModuleType


def _load() -> ModuleType | None:
    try:
        return importlib.import_module("kvobs.kernels._native")
    except ImportError:  # no C compiler at install time: the torch path runs instead
        return None


native: ModuleType | None = _load()
