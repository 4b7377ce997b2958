"""``kvobs report``: a kvobs dashboard as one PNG, straight from Prometheus.

For a person without Grafana: every panel of the tiers dashboard (or, with
``--dashboard kvobs-host-pool``, the host pool verdict and health), drawn from
``query_range`` over the last ``--range``. An unreachable Prometheus, a query error or
a panel without data ends with a one-line error naming the panel and the query, exit
status 2, and no file written.

Example:
    $ kvobs report --prometheus http://127.0.0.1:9090 --out tiers.png --range 30m
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import sys
from typing import Any

from kvobs.cli.http_timeout import add_http_timeout
from kvobs.cli.options import add_option, http_url, output_file
from kvobs.dashboards.variables import FILTERS
from kvobs.errors import ConfigError

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(s|m|h|d)$")
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def duration(text: str) -> float:
    """argparse type: a Prometheus-style duration (``90s``, ``15m``, ``2h``) in seconds."""
    if text.strip().startswith("-"):
        raise argparse.ArgumentTypeError(
            f"{text!r} is negative: pass how far back to draw, e.g. 15m or 2h")
    match = _DURATION.match(text.strip())
    if not match or float(match.group(1)) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration like 90s, 15m or 2h")
    seconds = float(match.group(1)) * _SECONDS[match.group(2)]
    if seconds > 366 * 86400:
        raise argparse.ArgumentTypeError(f"{text} is too long: use at most 366d")
    return seconds


def _installed(module: str) -> bool:
    """Whether ``module`` can be imported, without importing it (matplotlib is slow)."""
    if module in sys.modules:
        return sys.modules[module] is not None
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def register(subparsers: Any) -> None:
    """Add the ``report`` subcommand."""
    parser = subparsers.add_parser(
        "report",
        help="draw the KV cache tiers dashboard from Prometheus into one PNG",
        description="Run every panel query of the KV cache tiers dashboard against a "
        "Prometheus server and draw one PNG with one plot per panel. The label filters' "
        "environment twins are KVOBS_REPORT_<LABEL> (KVOBS_REPORT_MODEL...): KVOBS_MODEL "
        "is the model preset of capacity, demo and whatif.",
    )
    add_option(
        parser,
        "--prometheus",
        type=http_url,
        default=None,
        help="Prometheus base URL, e.g. http://127.0.0.1:9090",
    )
    add_option(parser, "--out", type=output_file(".png"), default=None, help="PNG file to write")
    add_option(parser, "--dashboard", default="kvobs-tiers",
               choices=("kvobs-tiers", "kvobs-host-pool", "kvobs-fleet"),
               help="which dashboard to draw (kvobs-host-pool: the host pool verdict)")
    add_option(
        parser,
        "--range",
        type=duration,
        default=900.0,
        help="history to draw, e.g. 15m or 2h (seconds)",
    )
    add_option(
        parser,
        "--rate-interval",
        default="1m",
        help="window of rate() in the panel queries ($__rate_interval)",
    )
    add_http_timeout(parser, default=10.0, default_text="each Prometheus query")
    for name, _label, help_ in FILTERS:
        preset = (" (KVOBS_MODEL is the model preset of capacity, demo and whatif, never "
                  "this filter)" if name == "model" else "")
        add_option(parser, f"--{name}", type=label_regex, default=None, env=filter_env(name),
                   help=f"regex on the {name} label: {help_}{preset}")
    parser.set_defaults(handler=run)


def filter_env(name: str) -> str:
    """The environment twin of label filter ``name``: ``KVOBS_REPORT_MODEL``.

    Not ``KVOBS_<LABEL>``: ``KVOBS_MODEL`` is the model preset of ``capacity``, ``demo``
    and ``whatif``, and one variable has one meaning.
    """
    return f"KVOBS_REPORT_{name.upper()}"


def label_regex(text: str) -> str:
    """argparse type: a label filter regex, checked here rather than by Prometheus.

    Python's ``re`` stands in for Prometheus's RE2: what it cannot compile (an unclosed
    group or class) Prometheus refuses too.
    """
    try:
        re.compile(text)
    except re.error as exc:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a regex ({exc}): e.g. 'llama.*' or 'a|b'") from None
    return text


def run(args: argparse.Namespace) -> int:
    """Write the PNG and say where."""
    if not args.prometheus:
        raise ConfigError(
            "--prometheus is required: pass the Prometheus URL, e.g. "
            "--prometheus http://127.0.0.1:9090"
        )
    if not args.out:
        raise ConfigError("--out is required: pass the PNG path to write, e.g. --out tiers.png")
    if not _DURATION.match(args.rate_interval):
        raise ConfigError(
            f"--rate-interval {args.rate_interval!r} is not a duration like 1m: pass e.g. "
            "--rate-interval 2m"
        )
    missing = [name for name in ("matplotlib", "numpy") if not _installed(name)]
    if missing:
        raise ConfigError(
            f"kvobs report needs {' and '.join(missing)}: pip install 'kvobs[report]'"
        )
    from kvobs.report import build_report

    filters = {
        name: getattr(args, name) for name, _l, _h in FILTERS if getattr(args, name) is not None
    }
    titles = build_report(
        args.prometheus,
        args.out,
        range_s=args.range,
        rate_interval=args.rate_interval,
        filters=filters,
        timeout_s=args.timeout,
        dashboard=args.dashboard,
    )
    print(f"wrote {args.out}: {len(titles)} panels of the {args.dashboard} dashboard")
    return 0
