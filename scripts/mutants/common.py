"""What a mutant is, and the two ways kvobs's mutants are made from a recorder call.

Example:
    >>> recorder_call("gpu.reuse", "kvobs/x.py", "tier.reuse(hits)", "hits")[0].new
    'tier.reuse(2 * (hits))'
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mutant:
    """Replace ``old`` (exactly one occurrence in ``path``) by ``new``."""

    id: str
    path: str
    old: str
    new: str


def recorder_call(event: str, path: str, call: str, first: str) -> list[Mutant]:
    """The doubled and the dropped mutant of ``call``, whose first argument is ``first``."""
    doubled = call.replace(f"({first}", f"(2 * ({first})", 1)
    dropped = call.replace(f"({first}", f"(0 * ({first})", 1)
    return [Mutant(f"{event}:doubled", path, call, doubled),
            Mutant(f"{event}:dropped", path, call, dropped)]


def keyword(event: str, path: str, old: str, name: str, value: str) -> list[Mutant]:
    """Doubled / dropped mutants of the keyword ``name=value`` inside ``old``."""
    return [Mutant(f"{event}:doubled", path, old,
                   old.replace(f"{name}={value}", f"{name}=2 * ({value})", 1)),
            Mutant(f"{event}:dropped", path, old,
                   old.replace(f"{name}={value}", f"{name}=0 * ({value})", 1))]


def lookup_count(path: str, call: str) -> list[Mutant]:
    """The lookup counted twice (an extra empty lookup first) and not at all, for the
    indented ``inst.rec.lookup(`` call ``call``."""
    return [Mutant("lookup.count:doubled", path, call,
                   call.replace("    inst.rec.lookup(", "    inst.rec.lookup(0)\n"
                                "    inst.rec.lookup(", 1)),
            Mutant("lookup.count:dropped", path, call,
                   call.replace("    inst.rec.lookup(", "    (lambda *a, **k: None)(", 1))]


def counter_add(event: str, path: str, line: str, value: str) -> list[Mutant]:
    """Doubled / dropped mutants of the plain counter update ``line`` (``x += value``)."""
    return [Mutant(f"{event}:doubled", path, line, line.replace(f"+= {value}", f"+= 2 * {value}")),
            Mutant(f"{event}:dropped", path, line, line.replace(f"+= {value}", f"+= 0 * {value}"))]


def transfer(event: str, path: str, call: str, blocks: str, nbytes: str,
             indent: str = "        ") -> list[Mutant]:
    """A transfer call's blocks doubled / dropped, its bytes doubled / dropped and the
    operation counted twice (a second, empty transfer after it). ``call`` is
    ``link.transfer(blocks, nbytes...)``, standing alone on a line at ``indent``."""
    empty = call.replace(f"({blocks}, {nbytes}", "(0, 0", 1)
    return [*recorder_call(f"{event}.blocks", path, call, blocks),
            Mutant(f"{event}.bytes:doubled", path, call,
                   call.replace(f", {nbytes}", f", 2 * {nbytes}", 1)),
            Mutant(f"{event}.bytes:dropped", path, call, call.replace(f", {nbytes}", ", 0", 1)),
            Mutant(f"{event}.operations:doubled", path, f"{indent}{call}\n",
                   f"{indent}{call}\n{indent}{empty}\n")]


#: The saving a lookup's host and disk hits add at the prefill cost (``Recorder.lookup``).
LOOKUP_SAVED = ("            self.host_saved_s += host_hit * cost\n"
                "            self.disk_saved_s += disk_hit * cost\n        missed = tokens - hits")


def lookup_saved(tiers: tuple[str, ...] = ("host", "disk")) -> list[Mutant]:
    """The lookup's saved prefill seconds of each of ``tiers``, doubled and dropped."""
    return [mutant for tier in tiers for mutant in counter_add(
        f"lookup.saved({tier})", "kvobs/recorder.py", LOOKUP_SAVED, f"{tier}_hit * cost")]


def keys_argument(event: str, path: str, call: str, keys: str,
                  doubled: str | None = None) -> list[Mutant]:
    """The ``keys=`` argument in ``call`` dropped (``keys=None``: the thrash, residency and
    reuse trackers see nothing) and, given ``doubled``, replaced by it (every key twice)."""
    variants = [("dropped", "None"), *([("doubled", doubled)] if doubled else [])]
    return [Mutant(f"{event}.keys:{name}", path, call,
                   call.replace(f"keys={keys}", f"keys={new}", 1)) for name, new in variants]

