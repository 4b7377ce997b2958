"""The documentation: the MkDocs site builds with no warning, and the README's links resolve.

``mkdocs build --strict`` fails on a broken link or anchor between pages, on a page left
out of the nav and on any other warning; the README lives outside the site, so its
relative links (files, and headings within them) are checked here.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

from tests.required import REPO, missing

README = REPO / "README.md"
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", flags=re.M | re.S)


def _prose(text: str) -> str:
    """``text`` without its fenced code blocks (a link-like string there is code)."""
    return FENCE.sub("", text)


def _slug(heading: str) -> str:
    """The anchor GitHub (and MkDocs' toc, for these headings) gives a Markdown heading."""
    heading = re.sub(r"[`*_]", "", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", heading).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    return {_slug(m.group(1)) for m in re.finditer(r"^#{1,6} +(.+?) *#*$", _prose(path.read_text()),
                                                   flags=re.M)}


def test_the_site_builds_with_no_warning(tmp_path):
    for module in ("mkdocs", "material"):
        if importlib.util.find_spec(module) is None:
            missing(f"{module} is not installed: pip install -e '.[dev]'")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict",
                           "--config-file", str(REPO / "mkdocs.yml"),
                           "--site-dir", str(tmp_path / "site")],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    noisy = [line for line in output.splitlines() if re.search(r"WARNING|ERROR", line)]
    assert not noisy, "\n".join(noisy)
    pages = sorted(p.relative_to(REPO / "docs").with_suffix("")
                   for p in (REPO / "docs").rglob("*.md"))
    for page in pages:
        built = tmp_path / "site" / (page.parent if page.name == "index" else page) / "index.html"
        assert built.is_file(), f"docs/{page}.md was not built"


def test_every_relative_link_in_the_readme_resolves():
    targets = LINK.findall(_prose(README.read_text()))
    local = [t for t in targets if not re.match(r"[a-z][a-z0-9+.-]*:", t)]
    assert any(t.startswith("docs/") for t in local), "the README links into no docs page"
    broken = []
    for target in local:
        path, _, anchor = target.partition("#")
        file = README if not path else (REPO / path)
        if not file.exists():
            broken.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in _anchors(file):
            broken.append(f"{target}: no heading #{anchor} in {file.relative_to(REPO)}")
    assert not broken, "\n".join(broken)


def test_the_readme_stays_a_front_door():
    """A few hundred lines, the details in the docs; no work log anywhere."""
    assert len(README.read_text().splitlines()) <= 300
    for path in [README, *sorted((REPO / "docs").rglob("*.md"))]:
        found = re.findall(r".{0,40}\b[Ss]ession \d+.{0,40}", path.read_text())
        assert not found, f"{path.relative_to(REPO)}: {found}"


def test_the_slug_matches_the_headings_the_docs_link_to():
    assert _slug("What if the pool were bigger (or smaller)?") == \
        "what-if-the-pool-were-bigger-or-smaller"
    assert _slug("In PromQL and `kvobs whatif`") == "in-promql-and-kvobs-whatif"
    assert _slug("Securing /metrics") == "securing-metrics"
