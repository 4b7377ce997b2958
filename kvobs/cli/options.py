"""argparse helpers: every flag has a ``KVOBS_*`` environment twin.

Precedence follows OpenTelemetry's: an explicit flag, then the environment variable,
then the default. An environment value that does not parse is an error naming the
variable, not a silent fallback: a typo in a pod spec should not go unnoticed.

Example:
    >>> import argparse
    >>> parser = argparse.ArgumentParser()
    >>> add_option(parser, "--gpu-blocks", type=positive_int, default=4, help="GPU blocks")
    >>> parser.parse_args([]).gpu_blocks, env_name("--gpu-blocks")
    (4, 'KVOBS_GPU_BLOCKS')
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import Any, TypeVar

from kvobs.errors import ConfigError

_T = TypeVar("_T")


def env_name(flag: str) -> str:
    """``--metrics-addr`` -> ``KVOBS_METRICS_ADDR``."""
    return "KVOBS_" + flag.lstrip("-").replace("-", "_").upper()


def positive_int(text: str) -> int:
    """argparse type: an integer > 0."""
    value = _parse(int, text, "an integer")
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text} must be > 0")
    return value


def non_negative_int(text: str) -> int:
    """argparse type: an integer >= 0."""
    value = _parse(int, text, "an integer")
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} must be >= 0")
    return value


def positive_float(text: str) -> float:
    """argparse type: a number > 0."""
    value = _parse(float, text, "a number")
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text} must be > 0")
    return value


def non_negative_float(text: str) -> float:
    """argparse type: a number >= 0."""
    value = _parse(float, text, "a number")
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"{text} must be >= 0")
    return value


def _parse(kind: Callable[[str], _T], text: str, what: str) -> _T:
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None


def boolean(text: str) -> bool:
    """argparse/env type: 1/true/yes/on or 0/false/no/off."""
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off", ""):
        return False
    raise argparse.ArgumentTypeError(f"{text!r} is not a boolean (use true or false)")


def add_flag(parser: argparse.ArgumentParser | Any, flag: str, *, help: str) -> None:
    """Add a store-true ``flag`` whose ``KVOBS_*`` twin (true/false) sets its default."""
    env = env_name(flag)
    raw = os.environ.get(env)
    default = False
    if raw is not None:
        try:
            default = boolean(raw)
        except argparse.ArgumentTypeError as exc:
            raise ConfigError(f"environment variable {env}={raw!r} is invalid: {exc}") from None
    parser.add_argument(flag, action="store_true", default=default, help=f"{help} [env {env}]")


def add_option(
    parser: argparse.ArgumentParser | Any,
    flag: str,
    *,
    type: Callable[[str], Any] = str,
    default: Any = None,
    help: str,
    **kwargs: Any,
) -> None:
    """Add ``flag`` whose default comes from its ``KVOBS_*`` twin when that is set."""
    env = env_name(flag)
    raw = os.environ.get(env)
    if raw is not None and raw != "":
        try:
            default = type(raw)
        except (argparse.ArgumentTypeError, ValueError) as exc:
            raise ConfigError(f"environment variable {env}={raw!r} is invalid: {exc}") from None
        choices = kwargs.get("choices")
        if choices is not None and default not in choices:
            raise ConfigError(
                f"environment variable {env}={raw!r} is invalid: use one of {', '.join(choices)}"
            )
    shown = "none" if default is None else default
    parser.add_argument(
        flag, type=type, default=default, help=f"{help} [env {env}; default {shown}]", **kwargs
    )
