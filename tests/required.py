"""Prerequisites a test cannot run without: skipped locally, a failure under CI.

CI sets ``CI=true`` and installs everything (``make test``); a test there must never pass
by skipping because a binary, an engine venv or a generated file went missing.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path
from typing import NoReturn

import pytest

REPO = Path(__file__).resolve().parents[1]
TOOLS_BIN = REPO / ".tools" / "bin"
#: Why a test that needs torch (``kvobs demo``, the reference pool, the copy loops) skipped.
NO_TORCH = ("torch is not installed (kvobs demo, the reference pool and the copy loops move "
            "bytes with it): `pip install torch`, or `make setup`")


def missing(message: str) -> NoReturn:
    """Skip the test with ``message``, or fail it when running under CI."""
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def find_tool(name: str, installer: str) -> Path:
    """Binary ``name`` from ``$REPO/.tools/bin`` or PATH; ``installer`` says how to get it."""
    local = TOOLS_BIN / name
    if local.is_file() and os.access(local, os.X_OK):
        return local
    found = shutil.which(name)
    if found:
        return Path(found)
    missing(f"{name} not found in {TOOLS_BIN} or PATH; run `bash {installer}`")


def need_torch() -> None:
    """Skip the test where torch cannot be imported, or fail it under CI."""
    if importlib.util.find_spec("torch") is None:
        missing(NO_TORCH)
