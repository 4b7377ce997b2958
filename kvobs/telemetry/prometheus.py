"""Serve ``/metrics`` for Prometheus to scrape.

Each server has a private registry (never the process-global one, so an engine's own
metrics and ours never collide) served over HTTP by prometheus_client; :meth:`MetricsServer.
attach` registers a recorder's :class:`~kvobs.telemetry.exposition.SnapshotCollector` in it.

Example:
    >>> from kvobs.telemetry.prometheus import parse_address
    >>> parse_address("0.0.0.0:9464"), parse_address("[::1]:0")
    (('0.0.0.0', 9464), ('::1', 0))
"""

from __future__ import annotations

import errno
from collections.abc import Sequence
from dataclasses import dataclass
from threading import Thread
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server

from kvobs.errors import ConfigError
from kvobs.recorder import Recorder
from kvobs.telemetry.exposition import SnapshotCollector
from kvobs.telemetry.series import SeriesSource


def parse_address(address: str, field: str = "--metrics-addr") -> tuple[str, int]:
    """Split ``HOST:PORT`` (IPv6 hosts in brackets); ConfigError names ``field``."""
    host, sep, port_text = str(address).rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port_text.isdigit() or int(port_text) > 65535:
        raise ConfigError(
            f"{field} {address!r} is invalid: use HOST:PORT, e.g. 127.0.0.1:9464 "
            "(0.0.0.0:9464 inside a pod)"
        )
    return host, int(port_text)


@dataclass
class MetricsServer:
    """A running ``/metrics`` endpoint; :meth:`attach` what it serves."""

    registry: CollectorRegistry
    host: str
    port: int
    _server: WSGIServer
    _thread: Thread

    @property
    def url(self) -> str:
        """Scrape URL of the endpoint."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def attach(self, recorder: Recorder, sources: Sequence[SeriesSource] = ()) -> None:
        """Serve ``recorder`` (and ``sources``: NVML) from now on."""
        self.registry.register(SnapshotCollector(recorder, sources))

    def close(self) -> None:
        """Stop serving and release the port."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def start_metrics_server(address: str, port_attempts: int = 1) -> MetricsServer:
    """Serve a private registry on ``address`` (``HOST:PORT``; port 0 = any).

    Args:
        address: ``HOST:PORT`` to bind.
        port_attempts: ports to try, from PORT upwards, when one is taken (several
            engine processes on one host starting from one base port); 1 tries only PORT.

    Example:
        >>> first = start_metrics_server("127.0.0.1:0")
        >>> second = start_metrics_server(f"127.0.0.1:{first.port}", port_attempts=8)
        >>> second.port != first.port
        True
        >>> second.close(); first.close()

    Raises:
        ConfigError: the address is malformed, every port tried is in use, or it cannot
            be bound.
    """
    host, port = parse_address(address)
    attempts = max(1, port_attempts) if port else 1
    for offset in range(attempts):
        candidate = port + offset
        if candidate > 65535:
            break
        server = _bind(address, host, candidate, last=offset == attempts - 1)
        if server is not None:
            return server
    raise ConfigError(
        f"--metrics-addr {address}: ports {port}-{min(port + attempts - 1, 65535)} are all "
        "in use: pass a free base port (or 0 for any)"
    )


def _bind(address: str, host: str, port: int, last: bool) -> MetricsServer | None:
    """Serve on ``host:port``; None when the port is taken and more may be tried."""
    registry = CollectorRegistry(auto_describe=True)
    try:
        server, thread = start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE and not last:
            return None
        raise bind_failure(address, port, exc) from None
    return MetricsServer(registry, host, server.server_port, server, thread)


def bind_failure(address: str, port: int, exc: OSError) -> ConfigError:
    """The one-line error for a ``/metrics`` address that cannot be bound."""
    if exc.errno == errno.EADDRINUSE:
        return ConfigError(f"--metrics-addr {address}: port {port} is already in use: pass a "
                           "free port (or 0 for any)")
    return ConfigError(f"--metrics-addr {address} cannot be bound ({exc.strerror or exc})")
