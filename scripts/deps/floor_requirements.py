"""Print kvobs's runtime dependencies pinned to the lowest version each declares.

``pyproject.toml`` says ``opentelemetry-sdk>=1.30``; this prints ``opentelemetry-sdk==1.30``
so that ``scripts/deps/floor.sh`` can build a venv at the floor of every declared range
(the main venv, built fresh, sits at the top of them). A dependency without a lower bound
is an error: its floor cannot be tested.

Usage (Python 3.11+: tomllib): python3 scripts/deps/floor_requirements.py [pyproject.toml]
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import tomllib

LOWER = re.compile(r"^\s*([A-Za-z0-9_.\-\[\]]+)\s*>=\s*([^,;\s]+)\s*$")


def floor(requirement: str) -> str:
    """``name>=X`` -> ``name==X``."""
    match = LOWER.match(requirement)
    if match is None:
        raise SystemExit(f"{requirement!r} has no single lower bound (name>=X): its floor "
                         "cannot be pinned; declare one in pyproject.toml")
    return f"{match.group(1)}=={match.group(2)}"


def main() -> int:
    path = Path(sys.argv[1] if len(sys.argv) > 1 else "pyproject.toml")
    dependencies = tomllib.loads(path.read_text())["project"]["dependencies"]
    print("\n".join(floor(r) for r in dependencies))
    return 0


if __name__ == "__main__":
    sys.exit(main())
