"""Regenerate the generated sections of the README and docs: the supported engine releases,
the metrics table and the event vocabulary.

python scripts/update_readme.py          # rewrite every file below that is stale
python scripts/update_readme.py --check  # exit 1 if any is stale

Each section lies between ``<!-- NAME:start -->`` and ``<!-- NAME:end -->`` markers in its
file; FILES says which sections each file holds and what generates them.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

from private_names import markdown_table as private_names_table

from kvobs import catalog, events
from kvobs.adapters import versions

ROOT = Path(__file__).resolve().parent.parent
#: file (relative to the checkout) -> {section name: what writes its body}
FILES: Mapping[str, Mapping[str, Callable[[], str]]] = {
    "README.md": {"versions-table": versions.markdown_table},
    "docs/metrics.md": {"metrics-table": catalog.markdown_table,
                        "fleet-metrics-table": lambda: catalog.markdown_table(
                            catalog.FLEET_METRICS)},
    "docs/engines/index.md": {"events-table": events.markdown_table},
    "docs/engines/private-names.md": {"private-names": private_names_table},
}


def render(text: str, sections: Mapping[str, Callable[[], str]], name: str = "the file") -> str:
    """``text`` with each generated section between its markers replaced."""
    for section, table in sections.items():
        start, end = f"<!-- {section}:start -->", f"<!-- {section}:end -->"
        if start not in text or end not in text:
            raise SystemExit(f"{name} lacks the {start} ... {end} markers")
        head, _, rest = text.partition(start)
        _, _, tail = rest.partition(end)
        text = f"{head}{start}\n{table()}\n{end}{tail}"
    return text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check, do not write")
    args = parser.parse_args()
    stale = []
    for name, sections in FILES.items():
        path = ROOT / name
        current = path.read_text()
        wanted = render(current, sections, name)
        if current == wanted:
            continue
        stale.append(name)
        if not args.check:
            path.write_text(wanted)
    if args.check and stale:
        print(f"generated tables are stale in {', '.join(stale)}: "
              "run python scripts/update_readme.py")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
