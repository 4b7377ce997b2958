"""Read a fleet endpoint as Prometheus does, for the fleet tests in every venv."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Callable

from prometheus_client.parser import text_string_to_metric_families


def scrape(url: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of ``url``: ``(name, labels) -> value``."""
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str,
          **labels: str) -> float:
    """The sum of ``name``'s samples carrying ``labels``."""
    return sum(v for (n, got), v in samples.items()
               if n == name and set(labels.items()) <= got)


def wait_for(url: str, ready: Callable[[dict[tuple[str, frozenset[tuple[str, str]]], float]],
                                       bool], limit_s: float = 15.0) \
        -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Scrape ``url`` until ``ready`` holds of a scrape; the last scrape, or AssertionError."""
    deadline = time.monotonic() + limit_s
    while True:
        samples = scrape(url)
        if ready(samples):
            return samples
        if time.monotonic() > deadline:
            raise AssertionError(f"not ready after {limit_s} s: " + repr(
                {k: v for k, v in samples.items() if v}))
        time.sleep(0.05)
