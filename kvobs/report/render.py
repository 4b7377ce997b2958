"""Draw fetched dashboard panels into one PNG with matplotlib (Agg, no display needed).

One plot per panel, in dashboard order, two per row: time series as lines (stacked
where the dashboard stacks them), stat panels as bars of the latest value, heatmaps as
duration bucket x time images. Colours follow :mod:`kvobs.report.palette`: one per
tier, outcome and direction, the same in every panel (and in ``kvobs top`` and the
dashboards); p99, capacity and failure lines are dashed in their series' colour. The PNG
is written to a temporary file beside ``out`` and renamed into place, so a failure never
leaves a partial picture behind.

Example:
    >>> from kvobs.report.fetch import PanelData
    >>> grid_shape(5)
    (3, 2)
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.axes import Axes
from matplotlib.ticker import FuncFormatter

from kvobs.report.fetch import PanelData
from kvobs.report.palette import OTHERS, dashed, series_color
from kvobs.report.prometheus_api import Series
from kvobs.report.units import describe, format_value

_COLUMNS = 2
#: PNG text chunk listing the panel titles drawn, in order (one plot each).
PANELS_KEY = "kvobs:panels"


def grid_shape(panels: int) -> tuple[int, int]:
    """(rows, columns) of the figure grid for ``panels`` plots."""
    return max(1, math.ceil(panels / _COLUMNS)), _COLUMNS


def _clock(x: float, _pos: object = None) -> str:
    """Tick label of an x position in unix seconds (the report's time axis is UTC)."""
    return dt.datetime.fromtimestamp(x, dt.timezone.utc).strftime("%H:%M:%S")


def _time_axis(ax: Axes) -> None:
    ax.xaxis.set_major_formatter(FuncFormatter(_clock))


def colors(lines: Sequence[tuple[str, Series]]) -> list[str]:
    """One colour per line: the palette's for its labels, else the next of its others.

    Example:
        >>> colors([("gpu", Series({"tier": "gpu"}, [])), ("x", Series({}, []))])
        ['#56A64B', '#19A0A0']
    """
    result, spare = [], 0
    for _name, series in lines:
        color = series_color(series.labels)
        if color is None:
            color, spare = OTHERS[spare % len(OTHERS)], spare + 1
        result.append(color)
    return result


def line_style(name: str) -> str:
    """Dashed for the second line of a pair that shares a colour (p99, capacity, failed)."""
    return "--" if dashed(name) else "-"


def _draw_timeseries(ax: Axes, panel: PanelData, stacked: bool) -> None:
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _p: format_value(v, panel.unit)))
    lines = [(name, s) for target in panel.targets for name, s in target.labelled()]
    palette = colors(lines)
    if stacked:
        grid = sorted({t for _n, s in lines for t, _v in s.finite_samples})
        rows = []
        for _name, s in lines:
            values = dict(s.finite_samples)
            rows.append([values.get(t, 0.0) for t in grid])
        ax.stackplot(grid, rows, labels=[n for n, _s in lines], colors=palette, alpha=0.8)
    else:
        for (name, s), color in zip(lines, palette, strict=True):
            ax.plot([t for t, _v in s.finite_samples], [v for _t, v in s.finite_samples],
                    label=name, linewidth=1.4, color=color, linestyle=line_style(name))
    _time_axis(ax)
    ax.legend(fontsize=7, loc="upper left", ncol=2 if len(lines) > 4 else 1, framealpha=0.7)
    ax.grid(alpha=0.3)
    if panel.unit == "percentunit":
        ax.set_ylim(0, 1.05)
    else:
        ax.set_ylim(bottom=0)


def _draw_stat(ax: Axes, panel: PanelData) -> None:
    lines = [(name, s) for target in panel.targets for name, s in target.labelled()]
    names = [n for n, _s in lines]
    values = [s.finite_samples[-1][1] for _n, s in lines]
    bars = ax.barh(names, values, color=colors(lines))
    for bar, value in zip(bars, values, strict=True):
        ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2,
                " " + format_value(value, panel.unit), va="center", fontsize=9)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _p: format_value(v, panel.unit)))
    ax.set_xlim(0, max(values) * 1.35 if max(values) > 0 else 1)
    ax.invert_yaxis()


def _draw_heatmap(ax: Axes, panel: PanelData) -> None:
    buckets = [s for target in panel.targets for s in target.series]
    buckets.sort(key=lambda s: float(s.labels.get("le", "inf")))
    grid = sorted({t for s in buckets for t, _v in s.finite_samples})
    cumulative = np.array([[dict(s.finite_samples).get(t, 0.0) for t in grid] for s in buckets])
    per_bucket = np.diff(cumulative, axis=0, prepend=0.0).clip(min=0.0)
    bounds = [float(s.labels.get("le", "inf")) for s in buckets]
    step = grid[-1] - grid[-2] if len(grid) > 1 else 1.0
    edges = np.array([*grid, grid[-1] + step]) - step / 2  # one cell centred on each sample
    mesh = ax.pcolormesh(edges, np.arange(len(bounds) + 1), per_bucket, cmap="Oranges")
    ax.set_yticks(np.arange(len(bounds)) + 1)
    ax.set_yticklabels(["+Inf" if math.isinf(b) else format_value(b, panel.unit)
                        for b in bounds], fontsize=6)
    ax.set_ylabel("duration ≤")
    _time_axis(ax)
    plt.colorbar(mesh, ax=ax, label="per second", pad=0.01)


def _umask() -> int:
    """The process umask (read by setting it, so set it straight back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def render_png(panels: Sequence[PanelData], out: Path, title: str, subtitle: str,
               stacked_titles: frozenset[str] = frozenset()) -> None:
    """Draw ``panels`` into ``out`` (PNG); ``stacked_titles`` are drawn as stacked areas."""
    rows, cols = grid_shape(len(panels))
    fig, axes = plt.subplots(rows, cols, figsize=(8.5 * cols, 3.9 * rows), squeeze=False)
    try:
        fig.suptitle(f"{title}\n{subtitle}", fontsize=14, y=0.995)
        for ax, panel in zip(axes.flat, panels, strict=False):
            ax.set_title(panel.title, fontsize=11, loc="left", fontweight="bold")
            if panel.kind == "stat":
                _draw_stat(ax, panel)
            elif panel.kind == "heatmap":
                _draw_heatmap(ax, panel)
            else:
                _draw_timeseries(ax, panel, panel.title in stacked_titles)
                ax.set_ylabel(describe(panel.unit), fontsize=8)
            if panel.notes:
                ax.text(0.99, 0.02, "; ".join(panel.notes), transform=ax.transAxes,
                        ha="right", va="bottom", fontsize=7, color="#777777")
            ax.tick_params(labelsize=7)
        for ax in list(axes.flat)[len(panels):]:
            ax.set_visible(False)
        fig.tight_layout(rect=(0, 0, 1, 0.985 - 0.012 * (4 / max(rows, 1))))
        fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
        try:
            os.fchmod(fd, 0o666 & ~_umask())  # mkstemp's 0600 is for the temporary name only
            with os.fdopen(fd, "wb") as handle:
                fig.savefig(handle, format="png", dpi=90, metadata={
                    "Title": title, "Software": "kvobs report",
                    PANELS_KEY: json.dumps([p.title for p in panels]),
                })
            os.replace(tmp, out)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    finally:
        plt.close(fig)
