"""``kvobs dashboards``: regenerate the Grafana dashboards and Prometheus rules.

Writes ``dashboards/generated/*.json``, ``dashboards/rules/*.yaml`` and their copies in
``helm/kvobs/files/`` from the Python sources in ``dashboards/``. ``--check`` writes
nothing and exits 1 when a committed file differs from what the sources generate.

Example:
    $ kvobs dashboards            # in a checkout: rewrite what changed
    $ kvobs dashboards --check    # CI: fail on drift
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from kvobs.cli.options import add_flag, add_option
from kvobs.errors import ConfigError


def register(subparsers: Any) -> None:
    """Add the ``dashboards`` subcommand."""
    parser = subparsers.add_parser(
        "dashboards",
        help="regenerate the Grafana dashboards and Prometheus rules from the metric catalog",
        description="Render the kvobs Grafana dashboards (current Grafana JSON model) and "
        "Prometheus recording and alert rules from their sources, into dashboards/ and the "
        "Helm chart's files/.",
    )
    add_option(
        parser,
        "--root",
        type=Path,
        default=None,
        help="repository root to write into (default: the checkout kvobs runs from)",
    )
    add_flag(parser, "--check", help="write nothing; exit 1 if any generated file is stale")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Write (or check) every generated file under the repository root."""
    try:
        from kvobs.dashboards import drift, source_root, write
    except ImportError as exc:
        raise ConfigError(
            f"kvobs dashboards needs {exc.name}: pip install grafanalib pyyaml "
            "(or the project's dev extra)"
        ) from None
    root = args.root or source_root()
    if root is None:
        raise ConfigError(
            "--root is required: kvobs is not running from a source checkout; "
            "pass the repository root that holds dashboards/ and helm/"
        )
    if not (root / "dashboards").is_dir():
        raise ConfigError(f"--root {root} has no dashboards/ directory: pass the repository root")
    if args.check:
        stale = drift(root)
        for path in stale:
            print(f"stale: {path} (run `kvobs dashboards`)", file=sys.stderr)
        return 1 if stale else 0
    for path in write(root):
        print(f"wrote {path}")
    return 0
