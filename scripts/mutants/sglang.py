"""sglang mutants: every event the sglang adapter records, doubled and dropped."""

from __future__ import annotations

from mutants.common import Mutant

SUITES = ((".venv-sglang/bin/python", "tests/engines/sglang0523"),)


def mutants() -> list[Mutant]:
    return []
