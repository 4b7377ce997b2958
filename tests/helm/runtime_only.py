"""Run the ``kvobs`` CLI as the container image would: only runtime dependencies importable.

The image installs kvobs with its runtime dependencies plus the extras named by the
Dockerfile's KVOBS_EXTRAS; the test venv also holds dev-only packages (pytest, PyYAML,
grafanalib, ...). This script hides every installed distribution outside that closure,
then calls ``kvobs.cli.main``, so an eager import of a dev-only package fails here as it
would in the image.

Example:
    $ KVOBS_IMAGE_EXTRAS=torch python runtime_only.py demo --duration 1
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import re
import sys
from collections.abc import Sequence
from importlib import metadata
from types import ModuleType

from packaging.requirements import Requirement


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def runtime_closure(root: str, extras: set[str]) -> set[str]:
    """Canonical names of ``root``, its dependencies with ``extras``, and theirs."""
    seen: set[str] = set()
    pending = [(root, extras)]
    while pending:
        name, wanted = pending.pop()
        if canonical(name) in seen:
            continue
        seen.add(canonical(name))
        try:
            requirements = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue  # an optional dependency not installed here: nothing to hide either
        for text in requirements:
            requirement = Requirement(text)
            marker = requirement.marker
            if marker is None or any(marker.evaluate({"extra": e}) for e in wanted | {""}):
                pending.append((requirement.name, set(requirement.extras)))
    return seen


def hidden_modules(allowed: set[str]) -> set[str]:
    """Top-level modules that only distributions outside ``allowed`` provide."""
    return {
        module
        for module, dists in metadata.packages_distributions().items()
        if not any(canonical(d) in allowed for d in dists)
    }


class HideModules(importlib.abc.MetaPathFinder):
    """Fails imports of ``names`` (and their submodules) as if they were not installed."""

    def __init__(self, names: set[str]) -> None:
        self.names = names

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname.partition(".")[0] in self.names:
            message = f"No module named {fullname!r} (not in the image)"
            raise ModuleNotFoundError(message, name=fullname)
        return None


def main(argv: list[str]) -> int:
    extras = {e for e in os.environ.get("KVOBS_IMAGE_EXTRAS", "").split(",") if e}
    hidden = hidden_modules(runtime_closure("kvobs", extras)) - {"kvobs"}
    for name in [m for m in sys.modules if m.partition(".")[0] in hidden]:
        del sys.modules[name]  # e.g. packaging, imported above to read the metadata
    sys.meta_path.insert(0, HideModules(hidden))
    from kvobs.cli import main as kvobs_main

    return int(kvobs_main(argv))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
