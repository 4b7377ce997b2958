"""A small client for Prometheus's HTTP query API (``/api/v1/query_range``, ``/api/v1/query``).

Only the standard library: the report must run wherever kvobs runs. Every failure is a
:class:`QueryFailed` whose message says what went wrong in words a user can act on
(unreachable server, HTTP error, PromQL error); callers add which panel and query.

Example:
    >>> client = PrometheusClient("http://127.0.0.1:9090")
    >>> client.base_url
    'http://127.0.0.1:9090'
"""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any


class QueryFailed(Exception):
    """A query could not be answered; the message says why."""


@dataclass(frozen=True)
class Series:
    """One returned series: its labels and (unix seconds, value) samples."""

    labels: dict[str, str]
    samples: list[tuple[float, float]]

    @property
    def finite_samples(self) -> list[tuple[float, float]]:
        """Samples whose value is a finite number (Prometheus writes NaN and Inf as strings)."""
        return [(t, v) for t, v in self.samples if math.isfinite(v)]


class PrometheusClient:
    """Queries one Prometheus server.

    Args:
        base_url: server URL such as ``http://127.0.0.1:9090`` (a trailing ``/`` is fine).
        timeout_s: seconds to wait for each HTTP answer.
    """

    def __init__(self, base_url: str, timeout_s: float = 10.0) -> None:
        parsed = urllib.parse.urlparse(base_url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ValueError(f"{base_url!r} is not an http(s) URL: pass e.g. http://127.0.0.1:9090")
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s

    def query(self, expr: str, time_s: float | None = None) -> list[Series]:
        """Instant query: one sample per series."""
        params = {"query": expr}
        if time_s is not None:
            params["time"] = f"{time_s:.3f}"
        return self._call("/api/v1/query", params)

    def query_range(self, expr: str, start_s: float, end_s: float, step_s: float) -> list[Series]:
        """Range query from ``start_s`` to ``end_s`` (unix seconds) every ``step_s``."""
        params = {"query": expr, "start": f"{start_s:.3f}", "end": f"{end_s:.3f}",
                  "step": f"{step_s:g}"}
        return self._call("/api/v1/query_range", params)

    def _call(self, path: str, params: dict[str, str]) -> list[Series]:
        url = self.base_url + path
        body = urllib.parse.urlencode(params).encode()
        request = urllib.request.Request(
            url, data=body, headers={"Content-Type": "application/x-www-form-urlencoded"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                payload = json.loads(response.read())
        except urllib.error.HTTPError as exc:
            payload = _error_payload(exc)
            if payload is None:
                raise QueryFailed(f"{url} answered HTTP {exc.code} {exc.reason}: "
                                  "is this a Prometheus server?") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise QueryFailed(f"cannot reach Prometheus at {self.base_url} ({reason}): "
                              "check --prometheus") from None
        except ValueError:
            raise QueryFailed(f"{url} did not answer JSON: is this a Prometheus server?") from None
        if payload.get("status") != "success":
            kind = payload.get("errorType", "error")
            raise QueryFailed(f"Prometheus rejected the query ({kind}): {payload.get('error')}")
        return _series(payload.get("data", {}))


def _error_payload(exc: urllib.error.HTTPError) -> dict[str, Any] | None:
    """Prometheus answers 400/422/503 with a JSON error body; anything else is not Prometheus."""
    try:
        payload = json.loads(exc.read())
    except ValueError:
        return None
    return payload if isinstance(payload, dict) and "status" in payload else None


def _series(data: dict[str, Any]) -> list[Series]:
    result_type = data.get("resultType")
    result = data.get("result", [])
    if result_type == "matrix":
        return [Series(item["metric"], [(float(t), float(v)) for t, v in item["values"]])
                for item in result]
    if result_type == "vector":
        return [Series(item["metric"], [(float(item["value"][0]), float(item["value"][1]))])
                for item in result]
    if result_type == "scalar":
        return [Series({}, [(float(result[0]), float(result[1]))])]
    raise QueryFailed(f"unexpected Prometheus result type {result_type!r}")
