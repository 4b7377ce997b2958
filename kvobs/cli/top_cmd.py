"""``kvobs top``: watch one or more kvobs endpoints live in the terminal.

Example:
    $ kvobs top --url http://127.0.0.1:9464/metrics
    $ kvobs top --url http://node-a:9464/metrics --url http://node-b:9464/metrics
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from kvobs.cli.http_timeout import add_http_timeout
from kvobs.cli.options import add_flag, add_option, at_most, env_name, http_url, positive_float
from kvobs.errors import ConfigError

DEFAULT_URL = "http://127.0.0.1:9464/metrics"


def _min_interval(text: str) -> float:
    value = at_most(positive_float, 3600.0)(text)
    if value < 0.1:
        raise argparse.ArgumentTypeError(f"{text} is too small: use at least 0.1 (seconds)")
    return value


def register(subparsers: Any) -> None:
    """Add the ``top`` subcommand."""
    parser = subparsers.add_parser(
        "top",
        help="live terminal view of kvobs /metrics endpoints (q quits)",
        description="Watch kvobs endpoints: per-tier occupancy bars, the hit split, "
        "transfer throughput and latency per direction, drops, failures and thrash, "
        "refreshed every --interval seconds. An unreachable endpoint is shown as such "
        "and retried.",
    )
    env = env_name("--url")
    parser.add_argument(
        "--url",
        action="append",
        type=http_url,
        default=None,
        metavar="URL",
        help=f"/metrics URL to watch; repeat for several [env {env}, comma-separated; "
        f"default {DEFAULT_URL}]",
    )
    add_option(
        parser,
        "--interval",
        type=_min_interval,
        default=1.0,
        help="seconds between refreshes (rates are over this interval)",
    )
    add_http_timeout(parser, default=None,
                     default_text="each endpoint's /metrics; default the interval, at most 2")
    add_flag(parser, "--once", help="print one frame (after two scrapes) and exit")
    parser.set_defaults(handler=run)


def urls_from(args: argparse.Namespace) -> list[str]:
    """The URLs to watch: the flags, else the environment twin, else the default."""
    if args.url:
        return list(dict.fromkeys(args.url))
    env = env_name("--url")
    raw = os.environ.get(env, "")
    if not raw.strip():
        return [DEFAULT_URL]
    urls = []
    for item in raw.split(","):
        try:
            urls.append(http_url(item))
        except argparse.ArgumentTypeError as exc:
            raise ConfigError(f"environment variable {env}={raw!r} is invalid: {exc}") from None
    return list(dict.fromkeys(urls))


def run(args: argparse.Namespace) -> int:
    """Run the view until q or Ctrl-C (or print one frame with --once)."""
    from kvobs.top import run_top

    return run_top(urls_from(args), interval_s=args.interval, timeout_s=args.timeout,
                   once=args.once)
