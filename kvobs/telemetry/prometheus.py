"""The one ``/metrics`` server: coalesced collections, with or without a web config.

Each server has a private registry (never the process-global one, so an engine's own
metrics and ours never collide); :meth:`MetricsServer.attach` registers a recorder's
:class:`~kvobs.telemetry.exposition.SnapshotCollector` in it. Every request is served in
its own thread:

* collection is coalesced (:class:`~kvobs.telemetry.coalesce.CoalescingApp`): one at a
  time, shared by every scrape that arrives while it runs, at most one per
  ``min_interval_s``;
* a collection that fails answers ``500`` with one line (the recorder has counted it);
* with a web config (:mod:`kvobs.telemetry.webconfig`): TLS in the connection's thread
  (:mod:`kvobs.telemetry.tls`), basic auth and extra headers (:mod:`kvobs.telemetry.auth`);
* a client that connects and never speaks, or hangs up mid-response, times out or fails
  alone (:data:`CONNECTION_TIMEOUT_S`): other scrapes go on.

Example:
    >>> first = start_metrics_server("127.0.0.1:0")
    >>> second = start_metrics_server(f"127.0.0.1:{first.port}", port_attempts=8)
    >>> second.port != first.port, first.url.startswith("http://127.0.0.1:")
    (True, True)
    >>> second.close(); first.close()
"""

from __future__ import annotations

import errno
import gzip
import os
import socket
import ssl
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from socketserver import ThreadingMixIn
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from prometheus_client import CollectorRegistry

from kvobs.errors import ConfigError
from kvobs.telemetry.address import parse_address, url_host
from kvobs.telemetry.auth import auth_app
from kvobs.telemetry.coalesce import CoalescingApp, check_interval
from kvobs.telemetry.exposition import SnapshotCollector
from kvobs.telemetry.series import SeriesSource
from kvobs.telemetry.text import CONTENT_TYPE, render
from kvobs.telemetry.tls import RotatingContext
from kvobs.telemetry.webconfig import WebConfig, load_web_config

if TYPE_CHECKING:  # the recorder (and what it imports) loads with the engine
    from kvobs.recorder import Recorder

__all__ = ["MetricsServer", "parse_address", "start_metrics_server"]

#: Seconds a connection may take to finish its TLS handshake, send its request or read.
CONNECTION_TIMEOUT_S = 10.0


class _QuietHandler(WSGIRequestHandler):
    """No access log on stderr: the engine's output is not kvobs's to fill."""

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _Server(ThreadingMixIn, WSGIServer):
    """A thread per connection; TLS handshake and request inside the connection's thread."""

    daemon_threads = True
    tls: RotatingContext | None = None

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        conn = request
        try:
            conn.settimeout(CONNECTION_TIMEOUT_S)
            if self.tls is not None:
                conn = self.tls.accept(conn)
            self.finish_request(conn, client_address)
        except (OSError, ssl.SSLError):
            pass  # the client hung up, timed out, or failed the handshake: its problem only
        except Exception:
            self.handle_error(conn, client_address)
        finally:
            self.shutdown_request(conn)


def metrics_app(registry: CollectorRegistry) -> Callable[..., Any]:
    """The WSGI app that collects ``registry`` and answers the text format
    (:mod:`kvobs.telemetry.text`), gzipped when asked; ``name[]`` query parameters keep
    only those series. A collection that raises answers ``500`` with one line instead of
    a traceback (the collector counted it)."""

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        try:
            names = parse_qs(environ.get("QUERY_STRING", "")).get("name[]")
            source = registry.restricted_registry(names) if names else registry
            body = render(source.collect())
        except Exception as exc:
            start_response("500 Internal Server Error",
                           [("Content-Type", "text/plain; charset=utf-8")])
            return [f"kvobs: collection failed: {exc!r}\n".encode()]
        headers = [("Content-Type", CONTENT_TYPE)]
        if "gzip" in environ.get("HTTP_ACCEPT_ENCODING", ""):
            body = gzip.compress(body, compresslevel=1)  # fast: the engine's CPU pays
            headers.append(("Content-Encoding", "gzip"))
        start_response("200 OK", headers)
        return [body]

    return app


@dataclass
class MetricsServer:
    """A running ``/metrics`` endpoint; :meth:`attach` what it serves."""

    registry: CollectorRegistry
    host: str
    port: int
    app: CoalescingApp
    web_config: WebConfig | None
    _server: WSGIServer
    _thread: threading.Thread

    @property
    def url(self) -> str:
        """Scrape URL of the endpoint (``https://`` with TLS)."""
        scheme = "https" if self.web_config is not None and self.web_config.tls else "http"
        return f"{scheme}://{url_host(self.host)}:{self.port}/metrics"

    def attach(self, recorder: Recorder, sources: Sequence[SeriesSource] = ()) -> None:
        """Serve ``recorder`` (and ``sources``: NVML) from now on."""
        self.registry.register(SnapshotCollector(recorder, sources))

    def close(self) -> None:
        """Stop serving and release the port."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def start_metrics_server(
    address: str,
    web_config: WebConfig | str | os.PathLike[str] | None = None,
    *,
    port_attempts: int = 1,
    min_interval_s: float = 0.0,
    on_error: Callable[[BaseException], None] | None = None,
    field: str = "--metrics-addr",
) -> MetricsServer:
    """Serve a private registry on ``address`` (``HOST:PORT``; port 0 = any).

    Args:
        address: ``HOST:PORT`` to bind.
        web_config: a :class:`~kvobs.telemetry.webconfig.WebConfig`, the path of a web
            config file, or None for plain HTTP without authentication.
        port_attempts: ports to try, from PORT upwards, when one is taken (several
            engine processes on one host starting from one base port); 1 tries only PORT.
        min_interval_s: a collection serves the scrapes arriving this long after it
            started (:mod:`kvobs.telemetry.coalesce`); 0 keeps none, but scrapes that
            arrive while one runs still share it. Telemetry's default is 0.25 s.
        on_error: told about a certificate rotation that failed (the old files stay in
            use); e.g. ``lambda exc: recorder.error("telemetry.webconfig", exc)``.
        field: the flag or variable ``address`` came from, for error messages.

    Raises:
        ConfigError: the address or config is malformed, every port tried is in use, or
            it cannot be bound.
    """
    check_interval(min_interval_s)
    host, port = parse_address(address, field)
    config = load_web_config(web_config) if isinstance(web_config, str | os.PathLike) \
        else web_config
    tls = None
    if config is not None and config.tls is not None:
        tls = RotatingContext(config.tls, Path(config.path), on_error or (lambda exc: None))
    attempts = max(1, port_attempts) if port else 1
    for candidate in range(port, min(port + attempts, 65536)):
        registry = CollectorRegistry(auto_describe=True)
        app = CoalescingApp(metrics_app(registry), min_interval_s)
        served = app if config is None else auth_app(app, config.passwords, config.headers)
        try:
            server = _bind(host, candidate, served, tls)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE and candidate < port + attempts - 1:
                continue
            raise _bind_failure(field, address, candidate, exc) from None
        thread = threading.Thread(target=server.serve_forever, daemon=True,
                                  name="kvobs-metrics")
        thread.start()
        return MetricsServer(registry, host, server.server_port, app, config, server, thread)
    raise ConfigError(
        f"{field} {address}: ports {port}-{min(port + attempts - 1, 65535)} are all "
        "in use: pass a free base port (or 0 for any)"
    )


def _bind(host: str, port: int, app: Callable[..., Any],
          tls: RotatingContext | None) -> WSGIServer:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)

    class Server(_Server):
        address_family = infos[0][0]

    Server.tls = tls
    server = Server((str(infos[0][4][0]), port), _QuietHandler)
    server.set_app(app)
    return server


def _bind_failure(field: str, address: str, port: int, exc: OSError) -> ConfigError:
    """The one-line error for a ``/metrics`` address that cannot be bound."""
    if exc.errno == errno.EADDRINUSE:
        return ConfigError(f"{field} {address}: port {port} is already in use: pass a "
                           "free port (or 0 for any)")
    return ConfigError(f"{field} {address} cannot be bound ({exc.strerror or exc})")
