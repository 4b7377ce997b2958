"""``HOST:PORT``: the one parser of a listening address (flags, ``KVOBS_METRICS_ADDR``).

Example:
    >>> parse_address("0.0.0.0:9464"), parse_address("[::1]:0")
    (('0.0.0.0', 9464), ('::1', 0))
    >>> join_address("::1", 9465), shift_port("127.0.0.1:9464", 2)
    ('[::1]:9465', '127.0.0.1:9466')
"""

from __future__ import annotations

from kvobs.errors import ConfigError


def parse_address(address: str, field: str = "--metrics-addr") -> tuple[str, int]:
    """Split ``HOST:PORT`` (IPv6 hosts in brackets); ConfigError names ``field``.

    Raises:
        ConfigError: no host, no port, or a port above 65535.
    """
    host, sep, port_text = str(address).strip().rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port_text.isdigit() or int(port_text) > 65535:
        raise ConfigError(
            f"{field} {address!r} is invalid: use HOST:PORT, e.g. 127.0.0.1:9464 "
            "(0.0.0.0:9464 inside a pod)"
        )
    return host, int(port_text)


def url_host(host: str) -> str:
    """``host`` as it stands in a URL or address (IPv6 in brackets)."""
    return f"[{host}]" if ":" in host else host


def join_address(host: str, port: int) -> str:
    """``HOST:PORT`` again (the inverse of :func:`parse_address`)."""
    return f"{url_host(host)}:{port}"


def shift_port(address: str, offset: int, field: str = "KVOBS_METRICS_ADDR") -> str:
    """``address`` with its port moved up by ``offset`` (a process's rank); port 0 (any
    free port) stays 0 and the result never passes 65535."""
    host, port = parse_address(address, field)
    return join_address(host, min(port + offset, 65535) if port else 0)
