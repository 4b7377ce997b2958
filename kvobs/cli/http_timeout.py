"""``--timeout`` (``KVOBS_TIMEOUT``): one meaning for every subcommand that has it.

``kvobs top`` and ``kvobs report`` both wait on HTTP answers (an endpoint's ``/metrics``,
Prometheus's query API); the flag, its environment twin and its limits are the same in
both, only the default differs.

Example:
    >>> import argparse
    >>> parser = argparse.ArgumentParser()
    >>> add_http_timeout(parser, default=10.0)
    >>> parser.parse_args(["--timeout", "2.5"]).timeout
    2.5
"""

from __future__ import annotations

from typing import Any

from kvobs.cli.options import add_option, at_most, positive_float

MAX_TIMEOUT_S = 600.0
HELP = f"seconds to wait for each HTTP answer (at most {MAX_TIMEOUT_S:g})"


def add_http_timeout(parser: Any, *, default: float | None, default_text: str = "") -> None:
    """Add ``--timeout``; ``default_text`` describes a default that is not a number."""
    add_option(parser, "--timeout", type=at_most(positive_float, MAX_TIMEOUT_S),
               default=default, help=HELP + (f": {default_text}" if default_text else ""))
