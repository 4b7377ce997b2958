"""Serve ``/metrics`` behind TLS and basic auth, configured by a Prometheus web config file.

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

What kvobs does, and how it differs from the Go server:

- Plain HTTP sent to a TLS port gets ``400`` and the connection is closed, as the Go
  server answers; no metrics are served.
- A missing or wrong password gets ``401`` with ``WWW-Authenticate: Basic``. A hash is
  checked with bcrypt once per distinct (user, password); successes are cached (bounded)
  so that scrapes do not pay bcrypt's ~100 ms each. Unknown users cost a bcrypt check too.
  Checks run one at a time (bcrypt releases the GIL; a flood of wrong passwords then
  takes at most one core from the engine's machine).
- Each connection's TLS handshake runs in its own thread with a timeout, so a client
  that connects and never speaks holds no other scrape up.
- ``RequestClientCert`` and ``RequireAnyClientCert`` (request a certificate without
  verifying it) and ``cipher_suites`` / ``curve_preferences`` have no Python ``ssl``
  equivalent: they are refused with a ConfigError naming the field rather than ignored.
- The certificate, key and CA files are read again when their modification time
  changes (a rotated Secret), at the next connection; a broken rotation keeps the old
  ones and counts ``telemetry.webconfig`` in the recorder's error counter if one is given.

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

import base64
import binascii
import errno
import hashlib
import os
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from wsgiref.simple_server import make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer, _SilentHandler

from kvobs.errors import ConfigError
from kvobs.telemetry.prometheus import MetricsServer, bind_failure, parse_address

#: Environment twin of ``--web-config-file``.
ENV_VAR = "KVOBS_WEB_CONFIG_FILE"

CLIENT_AUTH_TYPES = (
    "NoClientCert",
    "RequestClientCert",
    "RequireAnyClientCert",
    "VerifyClientCertIfGiven",
    "RequireAndVerifyClientCert",
)
_VERIFYING = {"VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
              "RequireAndVerifyClientCert": ssl.CERT_REQUIRED}
TLS_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
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

#: Seconds a connection may take to finish its TLS handshake or send its request.
CONNECTION_TIMEOUT_S = 10.0
_AUTH_CACHE_LIMIT = 1024


def _where(path: Path, key: str) -> str:
    return f"--web-config-file {path}: {key}"


def _mapping(value: object, path: Path, key: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{_where(path, key)} must be a mapping, got {type(value).__name__}")
    return value


def _unknown(section: Mapping[str, Any], known: Iterable[str], path: Path, prefix: str) -> None:
    known = tuple(known)
    for key in section:
        if key not in known:
            name = f"{prefix}{key}"
            raise ConfigError(
                f"{_where(path, name)} is not a web config field (known: {', '.join(known)})"
            )


@dataclass(frozen=True)
class TlsFiles:
    """The files of ``tls_server_config``, resolved against the config file's directory."""

    cert_file: Path
    key_file: Path
    client_ca_file: Path | None
    client_auth_type: str
    min_version: ssl.TLSVersion
    max_version: ssl.TLSVersion | None

    def files(self) -> tuple[Path, ...]:
        """Every file the context is built from."""
        return (self.cert_file, self.key_file) + (
            (self.client_ca_file,) if self.client_ca_file else ())

    def context(self, source: Path) -> ssl.SSLContext:
        """A server context; ConfigError names the field whose file is unusable."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = self.min_version
        if self.max_version is not None:
            context.maximum_version = self.max_version
        try:
            context.load_cert_chain(self.cert_file, self.key_file)
        except ssl.SSLError as exc:
            raise ConfigError(
                f"{_where(source, 'tls_server_config.cert_file')} {self.cert_file} and key_file "
                f"{self.key_file} are not a usable certificate and matching key ({exc.reason})"
            ) from None
        except OSError as exc:
            raise ConfigError(
                f"{_where(source, 'tls_server_config.cert_file')}/key_file cannot be read "
                f"({exc.strerror}: {exc.filename})"
            ) from None
        if self.client_ca_file is not None:
            try:
                context.load_verify_locations(cafile=str(self.client_ca_file))
            except (ssl.SSLError, OSError) as exc:
                raise ConfigError(
                    f"{_where(source, 'tls_server_config.client_ca_file')} {self.client_ca_file} "
                    f"holds no usable CA certificate ({exc})"
                ) from None
        context.verify_mode = _VERIFYING.get(self.client_auth_type, ssl.CERT_NONE)
        return context


@dataclass
class WebConfig:
    """A parsed web config file.

    Attributes:
        path: the file it was read from.
        tls: the TLS files, or None to serve plain HTTP (loopback only is the default).
        users: user name -> bcrypt hash; empty means no authentication.
        headers: extra response headers.
    """

    path: Path
    tls: TlsFiles | None
    users: dict[str, bytes]
    headers: dict[str, str]
    _cache: dict[bytes, bool] = field(default_factory=dict, repr=False)
    _cache_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def check_password(self, user: str, password: str) -> bool:
        """Whether ``password`` matches ``user``'s bcrypt hash (successes cached)."""
        bcrypt = _require("bcrypt", "bcrypt")

        hashed = self.users.get(user)
        known = hashed is not None
        if hashed is None:  # spend the same time, so timing does not reveal user names
            hashed = _DUMMY_HASH
        key = hashlib.sha256(b"\0".join((user.encode(), password.encode(), hashed))).digest()
        if self._cache.get(key):
            return known
        with _BCRYPT_SLOTS:  # one check at a time: a flood of guesses takes one core, not all
            ok = bool(bcrypt.checkpw(password.encode(), _normalise(hashed))) and known
        if ok:
            with self._cache_lock:
                if len(self._cache) >= _AUTH_CACHE_LIMIT:
                    self._cache.clear()
                self._cache[key] = True
        return ok

    def context(self) -> ssl.SSLContext | None:
        """The TLS server context, or None when the config has no TLS."""
        return None if self.tls is None else self.tls.context(self.path)


#: bcrypt releases the GIL, so checks run beside the engine; this bounds them to one.
_BCRYPT_SLOTS = threading.BoundedSemaphore(1)

_DUMMY_HASH = b"$2b$10$" + b"N9qo8uLOickgx2ZMRZoMye" + b"IjZAgcfl7p92ldGxad68LJZdL17lhWy"


def _require(module: str, package: str) -> Any:
    """Import ``module`` (a kvobs dependency used only with a web config) or say what to install."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise ConfigError(
            f"--web-config-file needs the {package} package: pip install {package}"
        ) from None


def _normalise(hashed: bytes) -> bytes:
    # htpasswd and Go write $2y$; the bcrypt package checks $2b$, the same algorithm.
    return b"$2b$" + hashed[4:] if hashed.startswith(b"$2y$") else hashed


def hash_password(password: str, rounds: int = 10) -> str:
    """A bcrypt hash of ``password`` for ``basic_auth_users`` (what ``htpasswd -B`` writes)."""
    bcrypt = _require("bcrypt", "bcrypt")
    return str(bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds)).decode())


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
    yaml = _require("yaml", "PyYAML")
    if _require("bcrypt", "bcrypt") is None:  # pragma: no cover - _require raises
        raise AssertionError
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
        raise ConfigError(f"{_where(source, 'http_server_config.http2')} must be true or false")
    headers = _mapping(http.get("headers"), source, "http_server_config.headers")
    for name, value in headers.items():
        if not isinstance(name, str) or not isinstance(value, str) or "\n" in value:
            raise ConfigError(
                f"{_where(source, f'http_server_config.headers.{name}')} must be a one-line string"
            )
        if name.lower() in _RESERVED_HEADERS:
            raise ConfigError(
                f"{_where(source, f'http_server_config.headers.{name}')} is set by the server "
                "and cannot be configured"
            )
    users: dict[str, bytes] = {}
    for user, hashed in _mapping(top.get("basic_auth_users"), source, "basic_auth_users").items():
        where = _where(source, f"basic_auth_users.{user}")
        if not isinstance(user, str) or not user or ":" in user:
            raise ConfigError(f"{where}: a user name is a non-empty string without ':'")
        if not isinstance(hashed, str) or not hashed.startswith(_HASH_PREFIXES) \
                or len(hashed) != 60:
            raise ConfigError(
                f"{where} must be a bcrypt hash ($2y$..., 60 characters), not a password: "
                "make one with `htpasswd -nBC 10 \"\" | tr -d ':\\n'`"
            )
        users[user] = hashed.encode()
    config = WebConfig(source, tls, users, dict(headers))
    config.context()  # every TLS file is readable and the key matches, or ConfigError now
    return config


def _tls(section: dict[str, Any], source: Path, base: Path) -> TlsFiles | None:
    if not section:
        return None
    for name in section:
        if name in _TLS_UNSUPPORTED:
            raise ConfigError(
                f"{_where(source, f'tls_server_config.{name}')} is not supported by kvobs "
                "(Python's ssl module has no equivalent); remove it"
            )
    _unknown(section, _TLS_KEYS, source, "tls_server_config.")

    def text(key: str) -> str | None:
        value = section.get(key)
        if value is None or value == "":
            return None
        if not isinstance(value, str):
            raise ConfigError(f"{_where(source, f'tls_server_config.{key}')} must be a string")
        return value

    def file(key: str) -> Path | None:
        value = text(key)
        if value is None:
            return None
        resolved = Path(value) if Path(value).is_absolute() else base / value
        if not resolved.is_file():
            raise ConfigError(
                f"{_where(source, f'tls_server_config.{key}')} {resolved} does not exist"
            )
        return resolved

    cert, key_path = file("cert_file"), file("key_file")
    if cert is None or key_path is None:
        missing = "cert_file" if cert is None else "key_file"
        raise ConfigError(
            f"{_where(source, f'tls_server_config.{missing}')} is required when "
            "tls_server_config is set"
        )
    auth = text("client_auth_type") or "NoClientCert"
    if auth not in CLIENT_AUTH_TYPES:
        raise ConfigError(
            f"{_where(source, 'tls_server_config.client_auth_type')} {auth!r} is not one of "
            f"{', '.join(CLIENT_AUTH_TYPES)}"
        )
    if auth in ("RequestClientCert", "RequireAnyClientCert"):
        raise ConfigError(
            f"{_where(source, 'tls_server_config.client_auth_type')} {auth} (a certificate "
            "that is not verified) is not supported by kvobs: use VerifyClientCertIfGiven or "
            "RequireAndVerifyClientCert with client_ca_file"
        )
    ca = file("client_ca_file")
    if ca is not None and auth == "NoClientCert":
        raise ConfigError(
            f"{_where(source, 'tls_server_config.client_ca_file')} is set without a client "
            "auth policy: set client_auth_type: RequireAndVerifyClientCert"
        )
    if ca is None and auth in _VERIFYING:
        raise ConfigError(
            f"{_where(source, 'tls_server_config.client_auth_type')} {auth} needs "
            "client_ca_file, the CA that signs client certificates"
        )
    versions = []
    for version, default in (("min_version", "TLS12"), ("max_version", None)):
        value = text(version) or default
        if value is not None and value not in TLS_VERSIONS:
            raise ConfigError(
                f"{_where(source, f'tls_server_config.{version}')} {value!r} is not one of "
                f"{', '.join(TLS_VERSIONS)}"
            )
        versions.append(None if value is None else TLS_VERSIONS[value])
    minimum, maximum = versions
    assert minimum is not None
    if maximum is not None and maximum < minimum:
        raise ConfigError(
            f"{_where(source, 'tls_server_config.max_version')} is below min_version"
        )
    return TlsFiles(cert, key_path, ca, auth, minimum, maximum)


class _Contexts:
    """The TLS context, rebuilt when one of its files changes (a rotated Secret)."""

    def __init__(self, config: WebConfig, on_error: Callable[[BaseException], None]) -> None:
        assert config.tls is not None
        self._config = config
        self._tls = config.tls
        self._on_error = on_error
        self._lock = threading.Lock()
        self._stamp = self._mtimes()
        context = config.context()
        assert context is not None
        self.context = context

    def _mtimes(self) -> tuple[int, ...]:
        stamps = []
        for path in self._tls.files():
            try:
                stamps.append(path.stat().st_mtime_ns)
            except OSError:
                stamps.append(-1)
        return tuple(stamps)

    def current(self) -> ssl.SSLContext:
        stamp = self._mtimes()
        if stamp != self._stamp:
            with self._lock:
                if stamp != self._stamp:
                    self._stamp = stamp
                    try:
                        self.context = self._tls.context(self._config.path)
                    except ConfigError as exc:  # keep serving with the files that worked
                        self._on_error(exc)
        return self.context


_PLAIN_HTTP_REPLY = (b"HTTP/1.0 400 Bad Request\r\nContent-Type: text/plain\r\nConnection: close"
                     b"\r\n\r\nClient sent an HTTP request to an HTTPS server.\n")


class SecureWSGIServer(ThreadingWSGIServer):
    """Thread per connection; TLS handshake and basic auth inside the connection's thread."""

    contexts: _Contexts | None = None
    timeout_s: float = CONNECTION_TIMEOUT_S

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        conn = request
        try:
            conn.settimeout(self.timeout_s)
            if self.contexts is not None:
                first = conn.recv(1, socket.MSG_PEEK)
                if not first:
                    raise ConnectionError("closed before the handshake")
                if first != b"\x16":  # not a TLS handshake record: plain HTTP (or junk)
                    conn.sendall(_PLAIN_HTTP_REPLY)
                    raise ConnectionError("plain HTTP on a TLS port")
                conn = self.contexts.current().wrap_socket(conn, server_side=True)
            self.finish_request(conn, client_address)
        except (OSError, ssl.SSLError):
            pass  # the client hung up, timed out, or failed the handshake: its problem only
        except Exception:
            self.handle_error(conn, client_address)
        finally:
            self.shutdown_request(conn)


#: Default for ``min_interval_s``: at most one collection a second, however many scrape.
MIN_INTERVAL_S = 1.0
_CACHE_KEYS_LIMIT = 16


class CoalescingApp:
    """A WSGI app in front of the metrics app: renders at most once per ``min_interval_s``.

    Scrapes arriving within ``min_interval_s`` of the last collection get its bytes (one
    per variant: Accept, Accept-Encoding, query), and concurrent scrapes wait for the one
    collection in progress instead of each running their own. Collection runs in the
    engine's process (every recorder snapshot, the OpenTelemetry SDK, the text format):
    this bounds what scrapers can take from the engine to one collection per interval,
    whatever their number. Prometheus scrapes each target every 15-60 s, so its scrapes
    always see a fresh collection; 0 turns caching off (concurrent scrapes still share).

    Example:
        >>> calls = []
        >>> def metrics(environ, start_response):
        ...     calls.append(1)
        ...     start_response("200 OK", [("Content-Type", "text/plain")])
        ...     return [b"x 1\\n"]
        >>> app = CoalescingApp(metrics, min_interval_s=60)
        >>> env = {"REQUEST_METHOD": "GET", "PATH_INFO": "/metrics"}
        >>> for _ in range(3):
        ...     body = app(env, lambda status, headers: None)
        >>> len(calls), body
        (1, [b'x 1\\n'])
    """

    def __init__(self, app: Callable[..., Any], min_interval_s: float = MIN_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not min_interval_s >= 0:
            raise ConfigError(f"scrape min interval must be >= 0 seconds, got {min_interval_s!r}")
        self.app = app
        self.min_interval_s = min_interval_s
        self.collections = 0
        self._clock = clock
        self._lock = threading.Lock()
        self._cache: dict[tuple[str, ...], tuple[float, str, list[tuple[str, str]], bytes]] = {}

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        if environ.get("REQUEST_METHOD") != "GET":
            return self.app(environ, start_response)
        key = tuple(str(environ.get(name, "")) for name in
                    ("PATH_INFO", "QUERY_STRING", "HTTP_ACCEPT", "HTTP_ACCEPT_ENCODING"))
        arrived = self._clock()
        with self._lock:  # one collection at a time; waiters take its result
            entry = self._cache.get(key)
            if entry is None or (arrived - entry[0] >= self.min_interval_s and
                                 not (self.min_interval_s == 0 and entry[0] >= arrived)):
                entry = self._render(environ, key)
        _, status, headers, body = entry
        start_response(status, list(headers))
        return [body]

    def _render(self, environ: dict[str, Any],
                key: tuple[str, ...]) -> tuple[float, str, list[tuple[str, str]], bytes]:
        captured: list[Any] = []

        def capture(status: str, headers: list[tuple[str, str]], *exc: Any) -> Any:
            captured[:] = [status, headers]
            return lambda data: None

        started = self._clock()
        chunks = self.app(environ, capture)
        try:
            body = b"".join(chunks)
        finally:
            close = getattr(chunks, "close", None)
            if close is not None:
                close()
        self.collections += 1
        entry = (started, str(captured[0]), list(captured[1]), body)
        if len(self._cache) >= _CACHE_KEYS_LIMIT:
            self._cache.clear()
        self._cache[key] = entry
        return entry


def auth_app(app: Callable[..., Any], config: WebConfig) -> Callable[..., Any]:
    """Wrap the WSGI ``app``: basic auth when users are configured, configured headers."""
    extra = list(config.headers.items())

    def wrapped(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        if config.users and not _authorised(environ.get("HTTP_AUTHORIZATION", ""), config):
            start_response("401 Unauthorized", [
                ("WWW-Authenticate", 'Basic realm="kvobs", charset="UTF-8"'),
                ("Content-Type", "text/plain; charset=utf-8"), *extra])
            return [b"Unauthorized\n"]

        def respond(status: str, headers: list[tuple[str, str]], *exc: Any) -> Any:
            return start_response(status, headers + extra, *exc)

        return app(environ, respond)

    return wrapped


def _authorised(header: str, config: WebConfig) -> bool:
    scheme, _, encoded = header.partition(" ")
    if scheme.lower() != "basic":
        return False
    try:
        user, sep, password = base64.b64decode(encoded.strip(), validate=True).decode().partition(
            ":")
    except (binascii.Error, UnicodeDecodeError):
        return False
    if not sep:
        return False
    return config.check_password(user, password)


@dataclass
class SecureMetricsServer(MetricsServer):
    """A ``/metrics`` endpoint served per a web config (``https://`` when it has TLS)."""

    web_config: WebConfig | None = None

    @property
    def url(self) -> str:
        """Scrape URL of the endpoint."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        scheme = "https" if self.web_config is not None and self.web_config.tls else "http"
        return f"{scheme}://{host}:{self.port}/metrics"


def start_secure_metrics_server(
    address: str,
    web_config: WebConfig | str | os.PathLike[str] | None,
    port_attempts: int = 1,
    on_error: Callable[[BaseException], None] | None = None,
    min_interval_s: float = MIN_INTERVAL_S,
) -> SecureMetricsServer:
    """Like :func:`kvobs.telemetry.prometheus.start_metrics_server`, served per ``web_config``.

    Args:
        address: ``HOST:PORT`` to bind (port 0 = any).
        web_config: a :class:`WebConfig`, the path of a web config file, or None to
            serve plain HTTP without authentication (with the collection bound).
        port_attempts: ports to try from PORT upwards when one is taken.
        on_error: told about a certificate rotation that failed (the old files stay in
            use); e.g. ``lambda exc: recorder.error("telemetry.webconfig", exc)``.
        min_interval_s: at most one collection per this many seconds (see
            :class:`CoalescingApp`); 0 collects at every scrape.

    Raises:
        ConfigError: a bad address or config file, or no port could be bound.
    """
    if web_config is None:
        config = WebConfig(Path("(none)"), None, {}, {})
    elif isinstance(web_config, WebConfig):
        config = web_config
    else:
        config = load_web_config(web_config)
    CoalescingApp(lambda environ, start_response: [], min_interval_s)  # checks the value
    host, port = parse_address(address)
    contexts = _Contexts(config, on_error or (lambda exc: None)) if config.tls else None
    attempts = max(1, port_attempts) if port else 1
    for offset in range(attempts):
        candidate = port + offset
        if candidate > 65535:
            break
        server = _bind(address, host, candidate, config, contexts, min_interval_s,
                       last=offset == attempts - 1)
        if server is not None:
            return server
    raise ConfigError(
        f"--metrics-addr {address}: ports {port}-{min(port + attempts - 1, 65535)} are all "
        "in use: pass a free base port (or 0 for any)"
    )


def _bind(address: str, host: str, port: int, config: WebConfig, contexts: _Contexts | None,
          min_interval_s: float, last: bool) -> SecureMetricsServer | None:
    registry = CollectorRegistry(auto_describe=True)

    class Server(SecureWSGIServer):
        pass

    Server.contexts = contexts
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        Server.address_family, bind_host = infos[0][0], str(infos[0][4][0])
        app = auth_app(CoalescingApp(make_wsgi_app(registry), min_interval_s), config)
        httpd = make_server(bind_host, port, app, Server, handler_class=_SilentHandler)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE and not last:
            return None
        raise bind_failure(address, port, exc) from None
    thread = threading.Thread(target=httpd.serve_forever, daemon=True, name="kvobs-metrics")
    thread.start()
    return SecureMetricsServer(registry, host, httpd.server_port, httpd, thread, config)


__all__ = [
    "ENV_VAR",
    "CoalescingApp",
    "SecureMetricsServer",
    "WebConfig",
    "auth_app",
    "hash_password",
    "load_web_config",
    "start_secure_metrics_server",
]
