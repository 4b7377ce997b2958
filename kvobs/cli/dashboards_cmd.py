"""``kvobs dashboards``: the Grafana dashboards and Prometheus rules kvobs ships.

For a user, ``--out DIR`` writes the dashboards and rules the installed package ships
(committed, generated files; no grafanalib needed) into ``DIR/dashboards/*.json`` and
``DIR/rules/*.rules.yaml``: a directory for Grafana's file provisioning and a glob for
Prometheus's ``rule_files``. DIR is created when its parent exists.

For a developer in a source checkout, ``--regenerate`` renders them from the Python
sources in ``dashboards/`` (grafanalib, PyYAML) into ``dashboards/generated/``,
``dashboards/rules/`` and their copies in ``helm/kvobs/files/``; ``--check`` writes
nothing and exits 1 when a committed file differs from what the sources generate.

Example:
    $ kvobs dashboards --out /etc/kvobs    # Grafana provisioning + Prometheus rule_files
    $ kvobs dashboards --regenerate        # in a checkout: rewrite what changed
    $ kvobs dashboards --check             # CI: fail on drift
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from kvobs.cli.options import add_flag, add_option, output_dir
from kvobs.errors import ConfigError


def register(subparsers: Any) -> None:
    """Add the ``dashboards`` subcommand."""
    parser = subparsers.add_parser(
        "dashboards",
        help="write the kvobs Grafana dashboards and Prometheus rules into a directory",
        description="Write the Grafana dashboards (current Grafana JSON model) and the "
        "Prometheus recording and alert rules kvobs ships into --out DIR: "
        "DIR/dashboards/*.json for Grafana provisioning, DIR/rules/*.rules.yaml for "
        "Prometheus rule_files. Developers regenerate them from dashboards/*.py in a "
        "source checkout with --regenerate or --check.",
    )
    mode = parser.add_mutually_exclusive_group()
    add_option(
        mode,
        "--out",
        type=output_dir,
        default=None,
        env="KVOBS_DASHBOARDS_OUT",  # KVOBS_OUT is report's PNG
        metavar="DIR",
        help="directory to write dashboards/ and rules/ into (created if its parent exists)",
    )
    add_flag(mode, "--regenerate",
             help="developers: render the committed files again from dashboards/*.py in "
             "the source checkout (needs grafanalib and pyyaml)")
    add_flag(mode, "--check",
             help="developers: write nothing; exit 1 if any committed generated file is stale")
    add_option(
        parser,
        "--root",
        type=Path,
        default=None,
        help="with --regenerate or --check: repository root to write into or compare "
        "(default: the checkout kvobs runs from; alone, implies --regenerate)",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Write the shipped files into ``--out``, or regenerate (or check) a checkout's."""
    if args.out is not None:
        if args.regenerate or args.check:  # one of them from its environment twin
            flag = "--check" if args.check else "--regenerate"
            raise ConfigError(
                f"--out and {flag} are both set (one of them by KVOBS_DASHBOARDS_OUT or "
                f"KVOBS_{flag[2:].upper()}): unset the variable of the one you do not mean"
            )
        if args.root is not None:
            raise ConfigError("--root goes with --regenerate or --check, not --out: drop "
                              "--root to write the shipped files into --out")
        return write_shipped(Path(args.out))
    if args.regenerate or args.check or args.root is not None:
        return regenerate(args.root, check=args.check)
    raise ConfigError(
        "--out is required: pass the directory to write the dashboards and rules into, e.g. "
        "--out ./kvobs-dashboards (developers: --regenerate in a source checkout)"
    )


def write_shipped(out: Path) -> int:
    """Copy every shipped dashboard and rule file under ``out``; say where each went."""
    from kvobs.report.boards import shipped_files

    files = shipped_files()
    path = out
    try:
        out.mkdir(exist_ok=True)
        for rel, data in files.items():
            path = out / rel
            path.parent.mkdir(exist_ok=True)
            path.write_bytes(data)
            print(f"wrote {path}")
    except OSError as exc:
        raise ConfigError(f"--out {out}: cannot write {path} ({exc.strerror}): pick a "
                          "directory you can write to") from None
    print(f"Grafana: provision the dashboards from {out / 'dashboards'}; Prometheus: "
          f"rule_files: ['{out / 'rules'}/*.rules.yaml']")
    return 0


def _checkout() -> Path | None:
    """The source checkout kvobs runs from, or None for a wheel install (no sources to
    render: ``dashboards/schema/`` is not package data)."""
    import kvobs.dashboards

    package = Path(kvobs.dashboards.__file__).resolve().parent
    if (package.name == "dashboards" and (package / "schema" / "source.json").is_file()
            and (package.parent / "helm").is_dir()):
        return package.parent
    return None


def regenerate(root: Path | None, *, check: bool) -> int:
    """Write (or check) every generated file under the repository root."""
    flag = "--check" if check else "--regenerate"
    checkout = _checkout()
    if checkout is None:
        raise ConfigError(
            f"{flag} renders from the dashboards/*.py of a source checkout, and this kvobs "
            "is installed from a package: run it in a clone of the kvobs repository, or use "
            "--out DIR for the shipped files"
        )
    if root is not None and not (root / "dashboards").is_dir():
        raise ConfigError(f"--root {root} has no dashboards/ directory: pass the repository root")
    try:
        from kvobs.dashboards import drift, write
    except ImportError as exc:
        raise ConfigError(
            f"kvobs dashboards {flag} needs {exc.name}: pip install grafanalib pyyaml "
            "(or the project's dev extra)"
        ) from None
    root = root or checkout
    if check:
        stale = drift(root)
        for path in stale:
            print(f"stale: {path} (run `kvobs dashboards --regenerate`)", file=sys.stderr)
        return 1 if stale else 0
    for path in write(root):
        print(f"wrote {path}")
    return 0
