"""PromQL building blocks shared by the dashboards, so each idiom is written once.

Ratios divide only where the denominator is positive (``a / (b > 0)``): an idle engine
shows no data instead of NaN. Quantiles only use directions that saw transfers in the
window, for the same reason.

Example:
    >>> rate("kvobs_lookups_total", 'tier="gpu"').endswith('tier="gpu"}[$__rate_interval])')
    True
"""

from __future__ import annotations

from .variables import selector

RATE_INTERVAL = "$__rate_interval"


def series(metric: str, *matchers: str) -> str:
    """``metric`` filtered by the dashboard variables and ``matchers``."""
    return f"{metric}{{{selector(*matchers)}}}"


def rate(metric: str, *matchers: str, window: str = RATE_INTERVAL) -> str:
    """Per-second rate of a counter (or histogram series) under the dashboard filters."""
    return f"rate({series(metric, *matchers)}[{window}])"


def sum_by(labels: str, expr: str) -> str:
    """``sum by (labels) (expr)``; empty ``labels`` sums everything."""
    return f"sum by ({labels}) ({expr})" if labels else f"sum({expr})"


def ratio(numerator: str, denominator: str, matching: str = "") -> str:
    """``numerator / denominator`` where the denominator is positive.

    Args:
        numerator: PromQL expression.
        denominator: PromQL expression.
        matching: vector matching clause such as ``ignoring (outcome) group_left ()``.
    """
    op = f"/ {matching} " if matching else "/ "
    return f"{numerator}\n{op}({denominator} > 0)"


def quantile(q: float, metric: str, by: str, *matchers: str) -> str:
    """``histogram_quantile`` of ``metric`` per ``by``, over groups that saw observations."""
    buckets = sum_by(f"le, {by}", rate(f"{metric}_bucket", *matchers))
    seen = sum_by(by, rate(f"{metric}_count", *matchers))
    return f"histogram_quantile({q}, {buckets}\n  and on ({by}) ({seen} > 0))"
