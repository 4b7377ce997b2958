"""The ``kvobs`` command: one module per subcommand, each with ``register(subparsers)``.

Bad input ends in a one-line ``kvobs: error: ...`` naming the field and the fix, exit
status 2, never a traceback. Every flag is checked when the command line is parsed (its
``type``) or first thing in the handler, before any heavy set-up (torch, pools, ports).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from kvobs import __version__
from kvobs.cli import capacity_cmd, dashboards_cmd, demo_cmd, report_cmd, top_cmd, whatif_cmd
from kvobs.cli.options import Parser
from kvobs.errors import KvobsError

SUBCOMMANDS = [demo_cmd, top_cmd, capacity_cmd, whatif_cmd, dashboards_cmd, report_cmd]


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every subcommand registered."""
    parser = Parser(
        prog="kvobs",
        description="Observability for tiered KV caches: GPU, host and disk tiers.",
    )
    parser.add_argument("--version", action="version", version=f"kvobs {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in SUBCOMMANDS:
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``kvobs`` console script."""
    try:
        args = build_parser().parse_args(argv)
        return int(args.handler(args) or 0)
    except KvobsError as exc:
        print(f"kvobs: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `kvobs capacity --json | head`: the reader left, not an error
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
