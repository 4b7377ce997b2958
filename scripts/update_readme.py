"""Regenerate the generated sections of README.md (the metrics table) from the catalog.

python scripts/update_readme.py          # rewrite README.md
python scripts/update_readme.py --check  # exit 1 if README.md is stale
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kvobs.catalog import markdown_table

README = Path(__file__).resolve().parent.parent / "README.md"
START, END = "<!-- metrics-table:start -->", "<!-- metrics-table:end -->"


def render(text: str) -> str:
    """``text`` with the metrics table between the markers replaced by the catalog's."""
    if START not in text or END not in text:
        raise SystemExit(f"README.md lacks the {START} ... {END} markers")
    head, _, rest = text.partition(START)
    _, _, tail = rest.partition(END)
    return f"{head}{START}\n{markdown_table()}\n{END}{tail}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check, do not write")
    args = parser.parse_args()
    current = README.read_text()
    wanted = render(current)
    if args.check:
        if current != wanted:
            print("README.md metrics table is stale: run python scripts/update_readme.py")
            return 1
        return 0
    README.write_text(wanted)
    return 0


if __name__ == "__main__":
    sys.exit(main())
