"""argparse helpers: every flag has a ``KVOBS_*`` environment twin.

Precedence follows OpenTelemetry's: an explicit flag, then the environment variable,
then the default. An environment value that does not parse is an error naming the
variable, not a silent fallback: a typo in a pod spec should not go unnoticed. Every
variable is read by :func:`kvobs.telemetry.settings.read_env`, the one environment policy
the plugins and ``kvobs.start_telemetry`` share.

Example:
    >>> import argparse
    >>> parser = argparse.ArgumentParser()
    >>> add_option(parser, "--gpu-blocks", type=positive_int, default=4, help="GPU blocks")
    >>> parser.parse_args([]).gpu_blocks, env_name("--gpu-blocks")
    (4, 'KVOBS_GPU_BLOCKS')
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn, TypeVar

from kvobs.errors import ConfigError, KvobsError
from kvobs.telemetry.settings import read_env

_T = TypeVar("_T")
_N = TypeVar("_N", int, float)


class UsageError(KvobsError):
    """The command line does not parse; ``kvobs`` prints it on one line and exits 2."""


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line: the flag, the problem, the fix.

    argparse would print the whole usage block and exit; this raises :class:`UsageError`
    instead, which the CLI prints as ``kvobs: error: ...``. Subparsers inherit the class.
    """

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see `{self.prog} --help`)")

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        """Parse, taking a value that starts with ``-`` as the value of the flag before it.

        argparse reads ``--range -5m`` as two flags and says "expected one argument";
        here ``-5m`` (not a flag of this parser) becomes ``--range=-5m``, so the flag's
        own check names the real problem (a negative duration).
        """
        if args is not None:
            args = self._join_dash_values(list(args))
        return super().parse_known_args(args, namespace)

    def _join_dash_values(self, args: list[str]) -> list[str]:
        joined: list[str] = []
        index = 0
        while index < len(args):
            arg = args[index]
            if arg == "--":  # everything after it is positional
                return joined + args[index:]
            action = self._option_string_actions.get(arg)
            if (action is not None and action.nargs is None and arg.startswith("--")
                    and index + 1 < len(args) and args[index + 1].startswith("-")
                    and not self._is_flag(args[index + 1])):
                joined.append(f"{arg}={args[index + 1]}")
                index += 2
            else:
                joined.append(arg)
                index += 1
        return joined

    def _is_flag(self, text: str) -> bool:
        name = text.split("=", 1)[0]
        if name in self._option_string_actions:
            return True
        return name.startswith("--") and any(  # an abbreviation argparse would accept
            option.startswith(name) for option in self._option_string_actions)


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
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
    if isinstance(value, float) and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number: pass e.g. 1.5")
    return value


def at_most(parse: Callable[[str], _N], limit: _N) -> Callable[[str], _N]:
    """argparse type: ``parse``, then no more than ``limit`` (huge values are typos).

    Example:
        >>> at_most(positive_int, 1024)("4096")
        Traceback (most recent call last):
        ...
        argparse.ArgumentTypeError: 4096 is too large: use at most 1,024
    """

    def check(text: str) -> _N:
        value = parse(text)
        if value > limit:
            shown = f"{int(limit):,}" if float(limit).is_integer() else f"{limit:,}"
            raise argparse.ArgumentTypeError(f"{text} is too large: use at most {shown}")
        return value

    check.__name__ = parse.__name__
    return check


def http_url(text: str) -> str:
    """argparse type: an ``http://`` or ``https://`` URL with a host."""
    parsed = urllib.parse.urlparse(text.strip())
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an http(s) URL: pass e.g. http://127.0.0.1:9464"
        )
    try:
        parsed.port  # noqa: B018 - raises ValueError for a port out of range
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} has an invalid port: use 1-65535") from None
    return text.strip()


def address(text: str) -> str:
    """argparse type: ``HOST:PORT`` to listen on (IPv6 hosts in brackets); the one parser
    of :mod:`kvobs.telemetry.address`."""
    from kvobs.telemetry.address import parse_address

    try:
        parse_address(text)
    except ConfigError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is invalid: use HOST:PORT, e.g. 127.0.0.1:9464 (0.0.0.0:9464 in a pod)"
        ) from None
    return text


def input_file(text: str) -> str:
    """argparse type: an existing, readable file (not a directory)."""
    path = Path(text)
    if not text:
        raise argparse.ArgumentTypeError("'' is empty: pass a file path")
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a directory: pass a file inside it")
    if not path.exists():
        raise argparse.ArgumentTypeError(f"{text} does not exist: check the path")
    if not os.access(path, os.R_OK):
        raise argparse.ArgumentTypeError(f"{text} is not readable: check its permissions")
    return text


def output_file(suffix: str | None = None) -> Callable[[str], str]:
    """argparse type: a file path kvobs can write, in a directory that exists.

    A missing directory is an error, not created: a typo in a path should not leave a
    new directory tree behind. The directory must accept a new file; that is tried for
    real (a probe file, removed at once), so read-only mounts fail here, not after
    minutes of work.
    """

    def check(text: str) -> str:
        example = f"out{suffix}" if suffix else "kvobs.log"
        if not text.strip():
            raise argparse.ArgumentTypeError(f"'' is empty: pass a file path such as {example}")
        path = Path(text)
        if path.is_dir():
            raise argparse.ArgumentTypeError(
                f"{text} is a directory: pass a file path such as {path / example}"
            )
        if suffix and path.suffix.lower() != suffix:
            raise argparse.ArgumentTypeError(
                f"{text} is not a {suffix} file: give a path ending in {suffix}, e.g. {example}"
            )
        if path.exists() and not os.access(path, os.W_OK):
            raise argparse.ArgumentTypeError(f"{text} is not writable: pick another path")
        _check_directory(text, path.absolute().parent)
        return text

    check.__name__ = "output file"
    return check


def output_dir(text: str) -> str:
    """argparse type: a directory kvobs can write into; it is created if its parent exists.

    Example:
        >>> output_dir("/nonexistent/kvobs")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        argparse.ArgumentTypeError: /nonexistent/kvobs cannot be created: directory /nonexistent ...
    """
    if not text.strip():
        raise argparse.ArgumentTypeError("'' is empty: pass a directory such as ./kvobs-dashboards")
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a file: pass a directory")
    if path.is_dir():
        if not _can_create_in(path):
            raise argparse.ArgumentTypeError(
                f"{text} is not writable: pick a directory you can write to")
        return text
    _check_directory(text, path.absolute().parent, "cannot be created")
    return text


def _check_directory(text: str, directory: Path, what: str = "cannot be written") -> None:
    """``directory`` (where ``text`` goes) exists and accepts a new file."""
    if not directory.exists():
        raise argparse.ArgumentTypeError(
            f"{text} {what}: directory {directory} does not exist: create it first or "
            "pick an existing directory"
        )
    if not directory.is_dir() or not _can_create_in(directory):
        raise argparse.ArgumentTypeError(
            f"{text} {what} (directory {directory} is not writable): "
            "pick a path in a writable directory"
        )


def _can_create_in(directory: Path) -> bool:
    try:
        with tempfile.TemporaryFile(dir=directory):
            return True
    except OSError:
        return False


def boolean(text: str) -> bool:
    """argparse/env type: 1/true/yes/on or 0/false/no/off."""
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off", ""):
        return False
    raise argparse.ArgumentTypeError(f"{text!r} is not a boolean (use true or false)")


def _as_value_error(parse: Callable[[str], _T]) -> Callable[[str], _T]:
    """``parse`` with argparse's type errors as ValueError (what ``read_env`` reports)."""

    def wrapped(text: str) -> _T:
        try:
            return parse(text)
        except argparse.ArgumentTypeError as exc:
            raise ValueError(str(exc)) from None

    return wrapped


def add_flag(parser: argparse.ArgumentParser | Any, flag: str, *, help: str) -> None:
    """Add a store-true ``flag`` whose ``KVOBS_*`` twin (true/false) sets its default."""
    env = env_name(flag)
    default = read_env(env, _as_value_error(boolean), False)
    parser.add_argument(flag, action="store_true", default=default, help=f"{help} [env {env}]")


def add_option(
    parser: argparse.ArgumentParser | Any,
    flag: str,
    *,
    type: Callable[[str], Any] = str,
    default: Any = None,
    help: str,
    env: str | None = None,
    **kwargs: Any,
) -> None:
    """Add ``flag`` whose default comes from its ``KVOBS_*`` twin when that is set.

    ``env`` names the twin when :func:`env_name` of the flag already means something
    else for another subcommand (one meaning per variable).
    """
    env = env or env_name(flag)
    choices = kwargs.get("choices")

    def parse(text: str) -> Any:
        value = _as_value_error(type)(text)
        if choices is not None and value not in choices:
            raise ValueError(f"use one of {', '.join(choices)}")
        return value

    default = read_env(env, parse, default)  # the one environment policy of kvobs
    shown = "none" if default is None else default
    parser.add_argument(
        flag, type=type, default=default, help=f"{help} [env {env}; default {shown}]", **kwargs
    )
