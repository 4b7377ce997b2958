"""The one log rate limiter: a key passes at most once per interval (or once ever).

kvobs logs a repeated failure (an instrumentation error, an OTLP export during an
outage, a version mismatch met by every instance) once, then counts it: the counters
carry the rate, the log the first occurrence.

Example:
    >>> now = [0.0]
    >>> limit = RateLimit(60.0, clock=lambda: now[0])
    >>> limit.allow("otlp"), limit.allow("otlp"), limit.allow("nvml")
    (True, False, True)
    >>> now[0] = 60.0
    >>> limit.allow("otlp")
    True
    >>> once = RateLimit(None)
    >>> once.allow("v0.9"), once.allow("v0.9")
    (True, False)
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable

#: Keys remembered at most; past it the oldest are forgotten (a key then passes again).
MAX_KEYS = 4096


class RateLimit:
    """Whether a key may be logged now.

    Args:
        interval_s: seconds before a key passes again; None passes each key once.
        clock: monotonic seconds.
    """

    def __init__(self, interval_s: float | None = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s = interval_s
        self._clock = clock
        self._last: dict[Hashable, float] = {}
        self._lock = threading.Lock()

    def allow(self, key: Hashable) -> bool:
        """True the first time ``key`` is seen, then once per interval."""
        now = self._clock()
        with self._lock:
            last = self._last.get(key)
            if last is not None and (self.interval_s is None or now - last < self.interval_s):
                return False
            if len(self._last) >= MAX_KEYS:
                del self._last[next(iter(self._last))]
            self._last.pop(key, None)
            self._last[key] = now
        return True
