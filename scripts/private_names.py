"""Every private name of an engine that kvobs's adapters touch, and why.

The adapters read engines' documented surfaces where there is one (stats objects, KV
events, public fields); where none carries what kvobs needs, they read a private name
(``_x``), which the next release may rename without a word. This scans each engine's
adapter package for the private names it reads or wraps (attribute reads such as
``manager._free_list``, and dotted paths in strings such as a spec's ``state`` or an
``attr_path``), leaving out kvobs's own private names (any defined in kvobs), and holds
the reason for each in :data:`REASONS`. ``tests/adapters/test_private_names.py`` fails
when the scan and the reasons disagree; ``scripts/update_readme.py`` writes the table into
``docs/engines/private-names.md``.

    python scripts/private_names.py            # the table
    python scripts/private_names.py --count    # names per engine
"""

from __future__ import annotations

import argparse
import ast
import re
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
KVOBS = REPO / "kvobs"
ENGINES = ("vllm", "sglang", "lmcache")
_PRIVATE = re.compile(r"_[A-Za-z0-9]\w*")
_PATH = re.compile(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)+")

#: engine -> private name -> why no public surface carries what kvobs reads there
REASONS: dict[str, dict[str, str]] = {
    "vllm": {
        "_block_hash": "vLLM 0.33 keeps a block's hash in this slot behind its public "
                       "`block_hash` property; the scrape's C walk reads the slot (a "
                       "property read costs a Python call a block). 0.34's public field "
                       "is read instead where present.",
        "_adopt_copies": "HiSparse: the host pages a request's prefix hit adopts, at the "
                         "moment it adopts them (no stats object or event carries them).",
    },
    "sglang": {
        "_execute_kv_backup": "the one place a backup refused for a full host pool shows "
                              "(it returns None); SGLang's metrics count the pages only "
                              "later, when it destroys them unbacked.",
    },
    "lmcache": {},
}


def _defined_by_kvobs() -> set[str]:
    """Private names kvobs defines itself: functions, classes, attributes it assigns
    (``self._x = ...``), module-level names, keyword arguments, and its modules."""
    names: set[str] = set()
    for path in KVOBS.rglob("*.py"):
        names.add(path.stem)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
                names.update(a.arg for a in (*node.args.args, *node.args.kwonlyargs)) \
                    if not isinstance(node, ast.ClassDef) else None
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.alias):
                names.add(node.asname or node.name.split(".")[-1])
    return {name for name in names if _PRIVATE.fullmatch(name)}


def _touched(path: Path) -> Iterator[str]:
    """Private names ``path`` reads as attributes, or names in strings that are a name or
    a dotted path (a spec's ``state``, a hooked method, ``getattr``)."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and _PRIVATE.fullmatch(node.attr):
            yield node.attr
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and (_PATH.fullmatch(node.value) or _PRIVATE.fullmatch(node.value)):
            yield from (part for part in node.value.split(".") if _PRIVATE.fullmatch(part))


def _not_ours(name: str) -> bool:
    return not name.startswith("_kvobs")  # kvobs's own marks on engine objects


def scan() -> dict[str, dict[str, list[str]]]:
    """engine -> private name -> the adapter files that touch it."""
    own = _defined_by_kvobs()
    found: dict[str, dict[str, list[str]]] = {}
    for engine in ENGINES:
        declared = REASONS.get(engine, {})
        names: dict[str, list[str]] = {}
        for path in sorted((KVOBS / "adapters" / engine).glob("*.py")):
            touched = {n for n in _touched(path) if _not_ours(n)}
            # a name kvobs also defines is the engine's where a reason declares it so
            for name in sorted(n for n in touched if n not in own or n in declared):
                names.setdefault(name, []).append(str(path.relative_to(REPO)))
        found[engine] = names
    return found


def markdown_table() -> str:
    """The docs table: engine, private name, where, why."""
    rows = ["| engine | private name | read in | why no public surface carries it |",
            "|---|---|---|---|"]
    for engine, names in scan().items():
        for name, files in sorted(names.items()):
            where = ", ".join(f"`{Path(f).name}`" for f in files)
            reason = REASONS.get(engine, {}).get(name, "(no reason given)")
            rows.append(f"| {engine} | `{name}` | {where} | {reason} |")
    counts = ", ".join(f"{engine} {len(names)}" for engine, names in scan().items())
    rows += ["", f"Private names touched: {counts}."]
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", action="store_true", help="names per engine only")
    args = parser.parse_args()
    found = scan()
    if args.count:
        for engine, names in found.items():
            print(f"{engine}: {len(names)}")
    else:
        print(markdown_table())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
