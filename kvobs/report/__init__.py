"""A picture of a kvobs dashboard without Grafana (the *KV cache tiers* one by default).

:func:`build_report` runs every panel query of a generated dashboard against a
Prometheus server over a time range and draws one PNG with one plot per panel. All
queries run before anything is drawn; any failure raises :class:`ReportError` naming
the panel and the query, and no file is written.

The dashboard is the JSON kvobs ships as package data (:mod:`.boards`), not rebuilt with
grafanalib; drawing needs matplotlib (``pip install 'kvobs[report]'``), loaded only
when a picture is drawn. Colours and unit labels come from :mod:`kvobs.palette` and
:mod:`kvobs.units`, which ``kvobs top`` and the dashboard sources share.

Example:
    >>> from kvobs.report import build_report, ReportError
    >>> try:
    ...     build_report("http://127.0.0.1:1", "/tmp/never.png", range_s=300)
    ... except ReportError as exc:
    ...     print(str(exc).startswith("panel 'Capacity per tier (tokens)', query"))
    True
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kvobs.dashboards.variables import all_values
from kvobs.report.boards import dashboard_json
from kvobs.report.fetch import ReportError, fetch_panels
from kvobs.report.prometheus_api import PrometheusClient

__all__ = ["PANELS_KEY", "ReportError", "build_report"]


def __getattr__(name: str) -> Any:
    if name == "PANELS_KEY":
        from kvobs.report.render import PANELS_KEY

        return PANELS_KEY
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

#: The dashboard the report draws by default; ``kvobs-host-pool`` opens with the host
#: pool verdict (net benefit, the what-if curve, wasted offloads).
DASHBOARD = "kvobs-tiers"


def build_report(prometheus_url: str, out: str | Path, *, range_s: float = 900.0,
                 step_s: float | None = None, rate_interval: str = "1m",
                 filters: Mapping[str, str] | None = None, end_s: float | None = None,
                 timeout_s: float = 10.0, dashboard: str = DASHBOARD) -> list[str]:
    """Render ``dashboard`` (a shipped dashboard's stem) from ``prometheus_url`` into the
    PNG ``out``.

    Args:
        prometheus_url: Prometheus base URL, e.g. ``http://127.0.0.1:9090``.
        out: PNG path to write.
        range_s: seconds of history to draw, ending at ``end_s`` (default: now).
        step_s: seconds between points; default ``range_s / 240``, at least 1.
        rate_interval: what ``$__rate_interval`` stands for in the panel queries.
        filters: dashboard variable -> regex (``job``, ``model``, ``instance``...);
            unset ones mean all.
        end_s: end of the range as unix seconds.
        timeout_s: seconds to wait for each Prometheus answer.
        dashboard: ``kvobs-tiers``, ``kvobs-host-pool`` or ``kvobs-fleet``.

    Returns:
        The titles of the panels drawn, in order (one plot each).
    """
    try:
        client = PrometheusClient(prometheus_url, timeout_s=timeout_s)
    except ValueError as exc:
        raise ReportError(f"--prometheus: {exc}") from None
    out = Path(out)
    if out.suffix.lower() != ".png":
        raise ReportError(f"--out {out}: the report is a PNG; give a path ending in .png")
    end = time.time() if end_s is None else end_s
    step = step_s or max(1.0, range_s / 240)
    variables = all_values(rate_interval, f"{range_s:.0f}s") | dict(filters or {})
    board = dashboard_json(dashboard)
    panels = fetch_panels(client, board, variables, end - range_s, end, step)
    chosen = ", ".join(f"{k}={v}" for k, v in sorted((filters or {}).items())) or "all instances"
    subtitle = (f"{prometheus_url} · last {range_s / 60:g} min · {chosen} · "
                f"rate window {rate_interval}")
    from kvobs.report.render import render_png  # matplotlib: only once there is data

    render_png(panels, out, board["title"], subtitle)
    return [p.title for p in panels]
