"""Regenerate the generated sections of README.md: the metrics table and the event vocabulary.

python scripts/update_readme.py          # rewrite README.md
python scripts/update_readme.py --check  # exit 1 if README.md is stale
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kvobs import catalog, events

README = Path(__file__).resolve().parent.parent / "README.md"
SECTIONS = {"metrics-table": catalog.markdown_table, "events-table": events.markdown_table}


def render(text: str) -> str:
    """``text`` with each generated section between its markers replaced."""
    for name, table in SECTIONS.items():
        start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
        if start not in text or end not in text:
            raise SystemExit(f"README.md lacks the {start} ... {end} markers")
        head, _, rest = text.partition(start)
        _, _, tail = rest.partition(end)
        text = f"{head}{start}\n{table()}\n{end}{tail}"
    return text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check, do not write")
    args = parser.parse_args()
    current = README.read_text()
    wanted = render(current)
    if args.check:
        if current != wanted:
            print("README.md generated tables are stale: run python scripts/update_readme.py")
            return 1
        return 0
    README.write_text(wanted)
    return 0


if __name__ == "__main__":
    sys.exit(main())
