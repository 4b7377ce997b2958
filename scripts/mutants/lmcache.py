"""lmcache mutants: every event the lmcache adapter records, doubled and dropped."""

from __future__ import annotations

from mutants.common import Mutant

SUITES = ((".venv-lmcache/bin/python", "tests/engines/lmcache056"),)


def mutants() -> list[Mutant]:
    return []
