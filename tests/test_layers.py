"""Layers point down: the import-linter contracts of ``.importlinter`` hold, and they
cover every module (a new top-level module of kvobs must be given a layer)."""

from __future__ import annotations

import ast
import configparser
import subprocess
import sys
from pathlib import Path

from tests.required import REPO, missing

CONFIG = REPO / ".importlinter"


def test_the_import_contracts_hold() -> None:
    lint_imports = Path(sys.executable).with_name("lint-imports")
    if not lint_imports.is_file():
        missing(f"{lint_imports} not found: pip install -e '.[dev]' (import-linter)")
    result = subprocess.run([str(lint_imports), "--no-cache", "--config", str(CONFIG)],
                            cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout, result.stdout


def _layered() -> set[str]:
    config = configparser.ConfigParser()
    config.read(CONFIG)
    layers = config["importlinter:contract:layers"]["layers"]
    return {name.strip() for line in layers.split("\n")
            for name in line.replace("|", ":").split(":") if name.strip()}


def test_every_module_of_kvobs_has_a_layer() -> None:
    # kvobs/__init__.py, the front door, is in none: its own contract keeps it there
    top = {f"kvobs.{path.stem}" for path in (REPO / "kvobs").glob("*.py")
           if path.name != "__init__.py"}
    top |= {f"kvobs.{path.parent.name}" for path in (REPO / "kvobs").glob("*/__init__.py")}
    layered = _layered()
    assert top - layered == set(), "give each a layer in .importlinter (see its comments)"
    assert layered - top == set(), "layers naming modules that are gone"


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found |= {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
    return found


def test_the_dashboards_are_imported_only_above_them() -> None:
    # import-linter sees kvobs.dashboards only as the checkout's dashboards/ (it lives
    # outside kvobs/), so who imports it is checked here: it imports core, and only the
    # report and the command line read it.
    readers = {path.relative_to(REPO).as_posix() for path in (REPO / "kvobs").rglob("*.py")
               if any(name == "kvobs.dashboards" or name.startswith("kvobs.dashboards.")
                      for name in _imports(path))}
    assert readers, "no module reads kvobs.dashboards: is this check still looking?"
    assert {p for p in readers if not p.startswith(("kvobs/report/", "kvobs/cli/"))} == set()
