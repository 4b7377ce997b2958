"""Coalesced collection: however many scrape, the engine pays for few collections.

A collection runs in the engine's process (one recorder snapshot, the text format).
:class:`CoalescingApp` sits in front of the metrics WSGI app of every kvobs ``/metrics``
server: one collection runs at a time and serves every scrape that arrives while it
runs, and a finished one also serves scrapes arriving within ``min_interval_s`` of its
start. So what scrapers can take from the engine is bounded by one collection per
interval, whatever their number. Prometheus scrapes a target every 15-60 s, so its
scrapes always see a fresh collection. A scrape never reads a collection that finished
before it arrived unless the interval allows it (``min_interval_s=0``: every scrape sees
every event that happened before it was sent). A failed collection (not 2xx) is not
kept: the next scrape tries again.

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

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvobs.errors import ConfigError

#: At most four collections a second, however many scrape (the engine-facing default):
#: short enough that ``kvobs top --interval 0.5`` reads a fresh collection each frame.
MIN_INTERVAL_S = 0.25
_VARIANT_KEYS = ("PATH_INFO", "QUERY_STRING", "HTTP_ACCEPT", "HTTP_ACCEPT_ENCODING")
_CACHE_KEYS_LIMIT = 16


@dataclass(frozen=True)
class _Response:
    started: float
    finished: float
    status: str
    headers: list[tuple[str, str]]
    body: bytes


def check_interval(min_interval_s: float, field: str = "scrape min interval") -> float:
    """``min_interval_s`` if it is a number >= 0, else ConfigError naming ``field``."""
    if not isinstance(min_interval_s, int | float) or not min_interval_s >= 0:
        raise ConfigError(f"{field} must be >= 0 seconds, got {min_interval_s!r}")
    return float(min_interval_s)


class CoalescingApp:
    """A WSGI app in front of ``app``: one collection at a time, at most one per interval.

    Args:
        app: the metrics WSGI app (it collects at each call).
        min_interval_s: a finished collection serves scrapes arriving this long after it
            started; 0 keeps nothing (scrapes arriving during a collection still share it).
        clock: monotonic seconds (tests pass a fake one).

    Attributes:
        collections: how many times ``app`` ran for a GET.
    """

    def __init__(self, app: Callable[..., Any], min_interval_s: float = MIN_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.app = app
        self.min_interval_s = check_interval(min_interval_s)
        self.collections = 0
        self._clock = clock
        self._lock = threading.Lock()
        self._cache: dict[tuple[str, ...], _Response] = {}

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        if environ.get("REQUEST_METHOD") != "GET":
            return self.app(environ, start_response)
        key = tuple(str(environ.get(name, "")) for name in _VARIANT_KEYS)
        arrived = self._clock()
        with self._lock:  # one collection at a time; waiters take its result
            entry = self._cache.get(key)
            if entry is None or not (entry.finished > arrived or
                                     arrived - entry.started < self.min_interval_s):
                entry = self._collect(environ, key)
        start_response(entry.status, list(entry.headers))
        return [entry.body]

    def _collect(self, environ: dict[str, Any], key: tuple[str, ...]) -> _Response:
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
        entry = _Response(started, self._clock(), str(captured[0]), list(captured[1]), body)
        if entry.status.startswith("2"):
            if len(self._cache) >= _CACHE_KEYS_LIMIT:
                self._cache.clear()
            self._cache[key] = entry
        else:
            self._cache.pop(key, None)
        return entry
