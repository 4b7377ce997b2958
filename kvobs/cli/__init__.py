"""The ``kvobs`` command: one module per subcommand, each with ``register(subparsers)``.

Bad input ends in a one-line ``kvobs: error: ...`` naming the field and the fix, exit
status 2, never a traceback. Every flag is checked when the command line is parsed (its
``type``) or first thing in the handler, before any heavy set-up (torch, pools, ports).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from kvobs._version import __version__
from kvobs.cli import (
    capacity_cmd,
    dashboards_cmd,
    demo_cmd,
    fleet_cmd,
    report_cmd,
    top_cmd,
    whatif_cmd,
)
from kvobs.cli.options import Parser
from kvobs.errors import ConfigError, KvobsError

SUBCOMMANDS = [demo_cmd, top_cmd, capacity_cmd, whatif_cmd, dashboards_cmd, report_cmd, fleet_cmd]


def build_parser(env_errors: dict[str, ConfigError] | None = None) -> argparse.ArgumentParser:
    """The top-level parser with every subcommand registered.

    A subcommand reads its flags' ``KVOBS_*`` twins as it registers; one that holds a bad
    value raises :class:`ConfigError`. With ``env_errors`` given, that error is kept there
    under the subcommand's name instead, so a variable meant for one subcommand never
    stops another (``main`` raises it when that subcommand runs).

    Example:
        >>> errors: dict[str, ConfigError] = {}
        >>> build_parser(errors).parse_args(["capacity", "--gpu-kv-gib", "16"]).command
        'capacity'
    """
    parser = Parser(
        prog="kvobs",
        description="Observability for tiered KV caches: GPU, host and disk tiers.",
    )
    parser.add_argument("--version", action="version", version=f"kvobs {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in SUBCOMMANDS:
        before = set(subparsers.choices)
        try:
            module.register(subparsers)
        except ConfigError as exc:
            if env_errors is None:
                raise
            (name,) = set(subparsers.choices) - before
            env_errors[name] = exc
    return parser


def _subcommand(argv: Sequence[str]) -> str | None:
    """The subcommand named on the command line (the first word that is not a flag)."""
    return next((word for word in argv if not word.startswith("-")), None)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``kvobs`` console script."""
    try:
        env_errors: dict[str, ConfigError] = {}
        parser = build_parser(env_errors)
        chosen = _subcommand(sys.argv[1:] if argv is None else argv)
        if chosen in env_errors:  # checked before parsing, as every env value is
            raise env_errors[chosen]
        args = parser.parse_args(argv)
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
