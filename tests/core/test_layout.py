"""Layout: presentation helpers shared without the views importing each other, the
adapter-author API public, no private names imported from other packages."""

from __future__ import annotations

import ast
import doctest
import subprocess
import sys
from pathlib import Path

import kvobs.adapters._hooks as hooks
import kvobs.adapters.api as api

KVOBS = Path(api.__file__).resolve().parents[1]


def imported_after(code: str) -> set[str]:
    probe = f"import sys; {code}; print(' '.join(sorted(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                            timeout=60, check=True)
    return set(result.stdout.split())


def test_top_and_report_share_palette_and_units_without_importing_each_other() -> None:
    top = imported_after("import kvobs.top.render, kvobs.top.app")
    assert {"kvobs.palette", "kvobs.units"} & top
    assert not {m for m in top if m.startswith(("kvobs.report", "dashboards", "kvobs.dashboards"))}
    report = imported_after("import kvobs.report")
    assert not {m for m in report if m.startswith("kvobs.top")}


def test_the_adapter_api_is_public_and_is_the_machinery_itself() -> None:
    for name in api.__all__:
        assert getattr(api, name) is getattr(hooks, name, getattr(api, name))
    result = doctest.testmod(api)
    assert result.failed == 0 and result.attempted > 0


def test_kvobs_imports_no_private_name_of_another_package() -> None:
    found = []
    for path in sorted(KVOBS.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                    and not node.module.startswith("kvobs"):
                parts = node.module.split(".") + [alias.name for alias in node.names]
                if any(part.startswith("_") and part != "__future__" for part in parts):
                    found.append(f"{path.relative_to(KVOBS.parent)}: from {node.module}")
    assert found == []
