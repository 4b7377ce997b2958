"""The Prometheus commands of the README and the docs run the binaries where
``scripts/deps/prometheus.sh`` puts them (``.tools/bin``, not on PATH)."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest

from tests.required import REPO

SCRIPT = REPO / "scripts" / "deps" / "prometheus.sh"
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
TOOLS = ("prometheus", "promtool")


def installed_dir() -> str:
    """The directory the script installs into, relative to the checkout (``.tools/bin``)."""
    (bin_dir,) = re.findall(r'^BIN="\$REPO/([^"]+)"$', SCRIPT.read_text(), flags=re.M)
    return bin_dir


def commands(page: Path) -> list[list[str]]:
    """Each command line of the page's ``sh`` blocks, as words (comments dropped)."""
    found = []
    for block in re.findall(r"```sh\n(.*?)```", page.read_text(), flags=re.S):
        for line in block.splitlines():
            try:
                words = shlex.split(line, comments=True)
            except ValueError:  # a continued line or a quote across lines: its words
                words = line.split("#", 1)[0].split()
            if words:
                found.append(words)
    return found


def prometheus_commands() -> list[tuple[str, list[str]]]:
    return [(str(page.relative_to(REPO)), words) for page in PAGES for words in commands(page)
            if Path(words[0]).name in TOOLS]


def test_the_docs_run_prometheus_from_where_the_script_installs_it() -> None:
    found = prometheus_commands()
    assert any(page == "docs/deployment/prometheus.md" for page, _ in found)
    wrong = [f"{page}: {shlex.join(words)}" for page, words in found
             if words[0] != f"{installed_dir()}/{Path(words[0]).name}"]
    assert not wrong, f"not the path scripts/deps/prometheus.sh installs: {wrong}"


def test_the_script_is_named_before_its_binaries_are_used() -> None:
    """A reader who copies the block in order has the binaries when they are run."""
    words = commands(REPO / "docs" / "deployment" / "prometheus.md")
    first_use = next(i for i, w in enumerate(words) if Path(w[0]).name in TOOLS)
    assert ["bash", "scripts/deps/prometheus.sh"] in words[:first_use]


def test_the_documented_paths_run_from_the_checkout_root() -> None:
    bin_dir = REPO / installed_dir()
    if not all((bin_dir / tool).exists() for tool in TOOLS):
        pytest.skip(f"{SCRIPT.relative_to(REPO)} has not run here")
    for _page, words in prometheus_commands():
        done = subprocess.run([words[0], "--version"], cwd=REPO, capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 0 and "version 2." in done.stdout + done.stderr, words
