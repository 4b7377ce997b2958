"""Scrape one kvobs ``/metrics`` endpoint into plain samples.

The text exposition is parsed with prometheus_client's parser (a kvobs dependency);
nothing else is needed to watch an endpoint. A failure never raises: it is a
:class:`Scrape` with ``error`` set, so an unreachable endpoint is shown as such and
retried on the next refresh.

Example:
    >>> scrape = parse_text("kvobs_lookups_total{engine=\\"e\\",model=\\"m\\"} 3.0\\n", 1.0)
    >>> scrape.total("kvobs_lookups_total"), scrape.labels("engine")
    (3.0, ['e'])
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

Labels = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Scrape:
    """One answer of one endpoint: sample name -> [(labels, value)], or an error."""

    url: str
    at_s: float
    samples: dict[str, list[tuple[Labels, float]]] = field(default_factory=dict)
    error: str | None = None
    elapsed_s: float = 0.0

    @property
    def ok(self) -> bool:
        """Whether the endpoint answered with metrics."""
        return self.error is None

    def series(self, name: str, **match: str) -> Iterator[tuple[dict[str, str], float]]:
        """(labels, value) of every sample called ``name`` whose labels include ``match``."""
        for labels, value in self.samples.get(name, ()):
            found = dict(labels)
            if all(found.get(k) == v for k, v in match.items()):
                yield found, value

    def total(self, name: str, **match: str) -> float:
        """Sum of the matching samples (0 when there are none)."""
        return sum(value for _labels, value in self.series(name, **match))

    def by(self, name: str, *keys: str, **match: str) -> dict[tuple[str, ...], float]:
        """Matching samples summed by the values of ``keys``."""
        result: dict[tuple[str, ...], float] = defaultdict(float)
        for labels, value in self.series(name, **match):
            result[tuple(labels.get(k, "") for k in keys)] += value
        return dict(result)

    def labels(self, key: str) -> list[str]:
        """Sorted distinct values of label ``key`` over all kvobs samples."""
        values = {
            dict(labels).get(key)
            for name, rows in self.samples.items()
            if name.startswith("kvobs_")
            for labels, _v in rows
        }
        return sorted(v for v in values if v)


def parse_text(text: str, at_s: float, url: str = "") -> Scrape:
    """Parse Prometheus text exposition taken at ``at_s`` (monotonic seconds)."""
    samples: dict[str, list[tuple[Labels, float]]] = defaultdict(list)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[sample.name].append((tuple(sorted(sample.labels.items())), sample.value))
    return Scrape(url, at_s, dict(samples))


def fetch(url: str, timeout_s: float = 2.0) -> Scrape:
    """GET ``url`` and parse it; any failure is a :class:`Scrape` with ``error`` set."""
    start = time.monotonic()
    try:
        request = urllib.request.Request(url, headers={"Accept": "text/plain"})
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            text = response.read().decode("utf-8", errors="replace")
    except urllib.error.HTTPError as exc:
        return Scrape(url, start, error=f"HTTP {exc.code} {exc.reason}")
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        return Scrape(url, start, error=str(reason) or type(exc).__name__)
    try:
        scrape = parse_text(text, start, url)
    except ValueError as exc:
        return Scrape(url, start, error=f"not Prometheus text ({exc})")
    if not any(name.startswith("kvobs_") for name in scrape.samples):
        return Scrape(url, start, error="answered, but with no kvobs_* metrics")
    return Scrape(url, start, scrape.samples, elapsed_s=time.monotonic() - start)
