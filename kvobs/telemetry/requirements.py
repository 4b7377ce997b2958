"""Check, before telemetry starts, that the packages kvobs exports with are ones it declares.

An engine's environment pins its own OpenTelemetry, prometheus_client or structlog, and
pip installs kvobs next to them with a warning at most. A version outside kvobs's
declared range would fail deep inside a library at the first export; this check fails at
start-up instead, with one line naming the package, the version found and the fix. The
ranges are read from kvobs's installed metadata (``pyproject.toml``), never repeated here.

Example:
    >>> check_declared({"structlog": ">=24.1"}, installed={"structlog": "23.2.0"})
    Traceback (most recent call last):
    ...
    kvobs.errors.ConfigError: kvobs needs structlog>=24.1 for telemetry, found 23.2.0: \
pip install 'structlog>=24.1'
    >>> check_declared({"structlog": ">=24.1"}, installed={"structlog": "26.1.0"})
"""

from __future__ import annotations

import importlib.metadata as metadata
from collections.abc import Mapping

from kvobs.errors import ConfigError

#: The packages telemetry calls into (the rest of kvobs's dependencies are not its).
TELEMETRY_PACKAGES = (
    "opentelemetry-api",
    "opentelemetry-sdk",
    "opentelemetry-exporter-otlp-proto-http",
    "prometheus-client",
    "structlog",
)


def _canonical(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def declared_ranges() -> dict[str, str]:
    """``{package: specifier}`` of the telemetry packages, as kvobs's metadata declares
    them; empty when kvobs runs from a source tree without metadata."""
    try:
        requires = metadata.requires("kvobs") or []
    except metadata.PackageNotFoundError:
        return {}
    try:
        from packaging.requirements import Requirement
    except ImportError:  # nothing to compare with: the libraries will speak for themselves
        return {}
    ranges = {}
    for text in requires:
        req = Requirement(text)
        if req.marker is None and _canonical(req.name) in TELEMETRY_PACKAGES:
            ranges[_canonical(req.name)] = str(req.specifier)
    return ranges


def installed_versions(names: list[str]) -> dict[str, str | None]:
    """The installed version of each package (None: not installed)."""
    found: dict[str, str | None] = {}
    for name in names:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def check_declared(ranges: Mapping[str, str] | None = None,
                   installed: Mapping[str, str | None] | None = None) -> None:
    """Raise :class:`ConfigError` for the first telemetry package outside its range.

    Args:
        ranges: ``{package: specifier}``; default :func:`declared_ranges`.
        installed: ``{package: version or None}``; default what is installed.
    """
    ranges = declared_ranges() if ranges is None else ranges
    if not ranges:
        return
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    installed = installed_versions(list(ranges)) if installed is None else installed
    for name, spec in ranges.items():
        version = installed.get(name)
        fix = f"pip install '{name}{spec}'"
        if version is None:
            raise ConfigError(f"kvobs needs {name}{spec} for telemetry, and it is not "
                              f"installed: {fix}")
        try:
            ok = SpecifierSet(spec).contains(Version(version), prereleases=True)
        except InvalidVersion:
            continue  # a local build with a version packaging cannot read: let it run
        if not ok:
            raise ConfigError(f"kvobs needs {name}{spec} for telemetry, found {version}: "
                              f"{fix}")
