"""Read a Prometheus web config file: TLS, client CA, basic auth users, response headers.

The file is the format of the Prometheus exporter-toolkit (``--web.config.file`` of
node_exporter, dcgm-exporter, Prometheus itself), so one Secret can serve them all::

    tls_server_config:
      cert_file: server.crt          # relative paths are relative to this file
      key_file: server.key
      client_auth_type: RequireAndVerifyClientCert   # optional, with client_ca_file
      client_ca_file: clients-ca.crt
      min_version: TLS12             # TLS10..TLS13; default TLS12
    http_server_config:
      headers: {Strict-Transport-Security: max-age=31536000}
    basic_auth_users:
      prometheus: $2y$10$...         # bcrypt hash (htpasswd -nBC 10 "" | tr -d ':')

This module only parses and checks; the server (:mod:`kvobs.telemetry.prometheus`)
serves per the result, with TLS from :mod:`kvobs.telemetry.tls` and basic auth from
:mod:`kvobs.telemetry.auth`. How kvobs differs from the Go server:

- Each connection's TLS handshake runs in its own thread with a timeout, so a client
  that connects and never speaks holds no other scrape up.
- ``RequestClientCert`` and ``RequireAnyClientCert`` (request a certificate without
  verifying it) and ``cipher_suites`` / ``curve_preferences`` have no Python ``ssl``
  equivalent: they are refused with a ConfigError naming the field rather than ignored.

Every mistake in the file is one :class:`~kvobs.errors.ConfigError` naming the field.

Example:
    >>> import tempfile, pathlib
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "web.yml"
    >>> _ = path.write_text("basic_auth_users:\\n  prom: " + hash_password("s3cret", 4) + "\\n")
    >>> config = load_web_config(path)
    >>> config.tls is None, sorted(config.users)
    (True, ['prom'])
    >>> config.check_password("prom", "s3cret"), config.check_password("prom", "nope")
    (True, False)
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvobs.errors import ConfigError
from kvobs.telemetry.auth import Passwords, hash_password, require
from kvobs.telemetry.tls import CLIENT_AUTH_TYPES, TLS_VERSIONS, VERIFYING, TlsFiles, where

#: Environment twin of ``--web-config-file``.
ENV_VAR = "KVOBS_WEB_CONFIG_FILE"

_TOP_KEYS = ("tls_server_config", "http_server_config", "basic_auth_users")
_TLS_KEYS = ("cert_file", "key_file", "client_auth_type", "client_ca_file", "min_version",
             "max_version", "prefer_server_cipher_suites")
_TLS_UNSUPPORTED = ("cipher_suites", "curve_preferences", "client_allowed_sans", "cert", "key",
                    "client_ca")
_HTTP_KEYS = ("http2", "headers")
_HASH_PREFIXES = ("$2a$", "$2b$", "$2y$")
# Headers the Go server refuses to let a config set (it owns them).
_RESERVED_HEADERS = {"authorization", "www-authenticate", "content-length", "content-type",
                     "content-encoding", "server", "date", "connection", "transfer-encoding"}


def _mapping(value: object, path: Path, key: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{where(path, key)} must be a mapping, got {type(value).__name__}")
    return value


def _unknown(section: Mapping[str, Any], known: Iterable[str], path: Path, prefix: str) -> None:
    known = tuple(known)
    for key in section:
        if key not in known:
            name = f"{prefix}{key}"
            raise ConfigError(
                f"{where(path, name)} is not a web config field (known: {', '.join(known)})"
            )


@dataclass
class WebConfig:
    """A parsed web config file.

    Attributes:
        path: the file it was read from.
        tls: the TLS files, or None to serve plain HTTP.
        users: user name -> bcrypt hash; empty means no authentication.
        headers: extra response headers.
    """

    path: Path
    tls: TlsFiles | None
    users: dict[str, bytes]
    headers: dict[str, str]
    passwords: Passwords = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.passwords = Passwords(self.users)

    def check_password(self, user: str, password: str) -> bool:
        """Whether ``password`` matches ``user``'s bcrypt hash (successes cached)."""
        return self.passwords.check(user, password)


def load_web_config(path: str | os.PathLike[str]) -> WebConfig:
    """Read and check a web config file; the TLS files are loaded once to check them.

    Raises:
        ConfigError: naming the file and the field that is wrong.
    """
    source = Path(path)
    try:
        text = source.read_text()
    except OSError as exc:
        raise ConfigError(
            f"--web-config-file {source} cannot be read ({exc.strerror}); pass the path of an "
            "exporter-toolkit web config file"
        ) from None
    yaml = require("yaml", "PyYAML")
    require("bcrypt", "bcrypt")  # the users' hashes are checked with it
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"--web-config-file {source} is not valid YAML{at}") from None
    top = _mapping(data, source, "the file")
    _unknown(top, _TOP_KEYS, source, "")
    base = source.parent
    tls = _tls(_mapping(top.get("tls_server_config"), source, "tls_server_config"), source, base)
    http = _mapping(top.get("http_server_config"), source, "http_server_config")
    _unknown(http, _HTTP_KEYS, source, "http_server_config.")
    if "http2" in http and not isinstance(http["http2"], bool):
        raise ConfigError(f"{where(source, 'http_server_config.http2')} must be true or false")
    headers = _mapping(http.get("headers"), source, "http_server_config.headers")
    for name, value in headers.items():
        if not isinstance(name, str) or not isinstance(value, str) or "\n" in value:
            raise ConfigError(
                f"{where(source, f'http_server_config.headers.{name}')} must be a one-line string"
            )
        if name.lower() in _RESERVED_HEADERS:
            raise ConfigError(
                f"{where(source, f'http_server_config.headers.{name}')} is set by the server "
                "and cannot be configured"
            )
    users: dict[str, bytes] = {}
    for user, hashed in _mapping(top.get("basic_auth_users"), source, "basic_auth_users").items():
        at = where(source, f"basic_auth_users.{user}")
        if not isinstance(user, str) or not user or ":" in user:
            raise ConfigError(f"{at}: a user name is a non-empty string without ':'")
        if not isinstance(hashed, str) or not hashed.startswith(_HASH_PREFIXES) \
                or len(hashed) != 60:
            raise ConfigError(
                f"{at} must be a bcrypt hash ($2y$..., 60 characters), not a password: "
                "make one with `htpasswd -nBC 10 \"\" | tr -d ':\\n'`"
            )
        users[user] = hashed.encode()
    if tls is not None:  # every TLS file is readable and the key matches, or ConfigError now
        tls.context(source)
    return WebConfig(source, tls, users, dict(headers))


def _tls(section: dict[str, Any], source: Path, base: Path) -> TlsFiles | None:
    if not section:
        return None
    for name in section:
        if name in _TLS_UNSUPPORTED:
            raise ConfigError(
                f"{where(source, f'tls_server_config.{name}')} is not supported by kvobs "
                "(Python's ssl module has no equivalent); remove it"
            )
    _unknown(section, _TLS_KEYS, source, "tls_server_config.")

    def text(key: str) -> str | None:
        value = section.get(key)
        if value is None or value == "":
            return None
        if not isinstance(value, str):
            raise ConfigError(f"{where(source, f'tls_server_config.{key}')} must be a string")
        return value

    def file(key: str) -> Path | None:
        value = text(key)
        if value is None:
            return None
        resolved = Path(value) if Path(value).is_absolute() else base / value
        if not resolved.is_file():
            raise ConfigError(
                f"{where(source, f'tls_server_config.{key}')} {resolved} does not exist"
            )
        return resolved

    cert, key_path = file("cert_file"), file("key_file")
    if cert is None or key_path is None:
        missing = "cert_file" if cert is None else "key_file"
        raise ConfigError(
            f"{where(source, f'tls_server_config.{missing}')} is required when "
            "tls_server_config is set"
        )
    auth = text("client_auth_type") or "NoClientCert"
    if auth not in CLIENT_AUTH_TYPES:
        raise ConfigError(
            f"{where(source, 'tls_server_config.client_auth_type')} {auth!r} is not one of "
            f"{', '.join(CLIENT_AUTH_TYPES)}"
        )
    if auth in ("RequestClientCert", "RequireAnyClientCert"):
        raise ConfigError(
            f"{where(source, 'tls_server_config.client_auth_type')} {auth} (a certificate "
            "that is not verified) is not supported by kvobs: use VerifyClientCertIfGiven or "
            "RequireAndVerifyClientCert with client_ca_file"
        )
    ca = file("client_ca_file")
    if ca is not None and auth == "NoClientCert":
        raise ConfigError(
            f"{where(source, 'tls_server_config.client_ca_file')} is set without a client "
            "auth policy: set client_auth_type: RequireAndVerifyClientCert"
        )
    if ca is None and auth in VERIFYING:
        raise ConfigError(
            f"{where(source, 'tls_server_config.client_auth_type')} {auth} needs "
            "client_ca_file, the CA that signs client certificates"
        )
    versions = []
    for version, default in (("min_version", "TLS12"), ("max_version", None)):
        value = text(version) or default
        if value is not None and value not in TLS_VERSIONS:
            raise ConfigError(
                f"{where(source, f'tls_server_config.{version}')} {value!r} is not one of "
                f"{', '.join(TLS_VERSIONS)}"
            )
        versions.append(None if value is None else TLS_VERSIONS[value])
    minimum, maximum = versions
    assert minimum is not None
    if maximum is not None and maximum < minimum:
        raise ConfigError(
            f"{where(source, 'tls_server_config.max_version')} is below min_version"
        )
    return TlsFiles(cert, key_path, ca, auth, minimum, maximum)


__all__ = ["ENV_VAR", "WebConfig", "hash_password", "load_web_config"]
