"""TLS for ``/metrics``: the server context of a web config, reloaded when its files change.

The certificate, key and CA files are read again when their modification time changes
(a rotated Secret), at the next connection; a broken rotation keeps the old ones and is
reported (``on_error``: the server counts ``telemetry.webconfig``). Plain HTTP sent to
the TLS port gets ``400`` and the connection is closed, as the Go server answers.

Example:
    >>> where(Path("web.yml"), "tls_server_config.cert_file")
    '--web-config-file web.yml: tls_server_config.cert_file'
"""

from __future__ import annotations

import socket
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kvobs.errors import ConfigError

CLIENT_AUTH_TYPES = (
    "NoClientCert",
    "RequestClientCert",
    "RequireAnyClientCert",
    "VerifyClientCertIfGiven",
    "RequireAndVerifyClientCert",
)
VERIFYING = {"VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
             "RequireAndVerifyClientCert": ssl.CERT_REQUIRED}
TLS_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
_PLAIN_HTTP_REPLY = (b"HTTP/1.0 400 Bad Request\r\nContent-Type: text/plain\r\nConnection: close"
                     b"\r\n\r\nClient sent an HTTP request to an HTTPS server.\n")


def where(path: Path, key: str) -> str:
    """The field ``key`` of the web config file ``path``, as errors name it."""
    return f"--web-config-file {path}: {key}"


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
                f"{where(source, 'tls_server_config.cert_file')} {self.cert_file} and key_file "
                f"{self.key_file} are not a usable certificate and matching key ({exc.reason})"
            ) from None
        except OSError as exc:
            raise ConfigError(
                f"{where(source, 'tls_server_config.cert_file')}/key_file cannot be read "
                f"({exc.strerror}: {exc.filename})"
            ) from None
        if self.client_ca_file is not None:
            try:
                context.load_verify_locations(cafile=str(self.client_ca_file))
            except (ssl.SSLError, OSError) as exc:
                raise ConfigError(
                    f"{where(source, 'tls_server_config.client_ca_file')} {self.client_ca_file} "
                    f"holds no usable CA certificate ({exc})"
                ) from None
        context.verify_mode = VERIFYING.get(self.client_auth_type, ssl.CERT_NONE)
        return context


class RotatingContext:
    """The TLS context of ``tls``, rebuilt when one of its files changes."""

    def __init__(self, tls: TlsFiles, source: Path,
                 on_error: Callable[[BaseException], None]) -> None:
        self._tls, self._source, self._on_error = tls, source, on_error
        self._lock = threading.Lock()
        self._stamp = self._mtimes()
        self.context = tls.context(source)

    def _mtimes(self) -> tuple[int, ...]:
        stamps = []
        for path in self._tls.files():
            try:
                stamps.append(path.stat().st_mtime_ns)
            except OSError:
                stamps.append(-1)
        return tuple(stamps)

    def current(self) -> ssl.SSLContext:
        """The context to accept the next connection with."""
        stamp = self._mtimes()
        if stamp != self._stamp:
            with self._lock:
                if stamp != self._stamp:
                    self._stamp = stamp
                    try:
                        self.context = self._tls.context(self._source)
                    except ConfigError as exc:  # keep serving with the files that worked
                        self._on_error(exc)
        return self.context

    def accept(self, conn: socket.socket) -> ssl.SSLSocket:
        """The TLS side of a new connection; ConnectionError for plain HTTP (answered 400)
        or a client that hung up before its handshake."""
        first = conn.recv(1, socket.MSG_PEEK)
        if not first:
            raise ConnectionError("closed before the handshake")
        if first != b"\x16":  # not a TLS handshake record: plain HTTP (or junk)
            conn.sendall(_PLAIN_HTTP_REPLY)
            raise ConnectionError("plain HTTP on a TLS port")
        return self.current().wrap_socket(conn, server_side=True)
