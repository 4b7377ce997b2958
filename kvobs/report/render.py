"""Draw fetched dashboard panels into one PNG with matplotlib (Agg, no display needed).

One plot per panel, in dashboard order, two per row: time series as lines (stacked
where the dashboard stacks them), stat panels as bars of the latest value, heatmaps as
duration bucket x time images. Each series is drawn as the dashboard's field overrides
say, which :mod:`kvobs.palette` generates: one colour per tier, outcome and direction,
the same in every panel (and in ``kvobs top`` and Grafana); a tier's states and eviction
reasons in shades and dashes of its colour; p99, capacity and failure lines dashed;
occupancy stacked per tier. Byte axes tick at powers of two with IEC labels. The PNG
is written to a temporary file beside ``out`` and renamed into place, so a failure never
leaves a partial picture behind.

Example:
    >>> from kvobs.report.fetch import PanelData, repeated
    >>> grid_shape(5)
    (3, 2)
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.axes import Axes
from matplotlib.ticker import FuncFormatter, Locator, MaxNLocator

from kvobs.palette import NEUTRAL, OTHERS, tier_color
from kvobs.report.fetch import PanelData, repeated
from kvobs.report.prometheus_api import Series
from kvobs.units import BINARY_UNITS, binary_ticks, describe, format_value

_COLUMNS = 2
#: PNG text chunk listing the panel titles drawn, in order (one plot each).
PANELS_KEY = "kvobs:panels"
#: PNG text chunk listing the verdicts in words the picture shows (:mod:`.verdict`).
VERDICT_KEY = "kvobs:verdict"


def verdicts(panels: Sequence[PanelData]) -> list[str]:
    """The verdict sentence of every panel that has one, in order."""
    from kvobs.report.verdict import panel_verdict

    return [words for panel in panels if (words := panel_verdict(panel))]


def grid_shape(panels: int) -> tuple[int, int]:
    """(rows, columns) of the figure grid for ``panels`` plots."""
    return max(1, math.ceil(panels / _COLUMNS)), _COLUMNS


def _clock(x: float, _pos: object = None) -> str:
    """Tick label of an x position in unix seconds (the report's time axis is UTC)."""
    return dt.datetime.fromtimestamp(x, dt.timezone.utc).strftime("%H:%M:%S")


def _time_axis(ax: Axes) -> None:
    ax.xaxis.set_major_formatter(FuncFormatter(_clock))


@dataclass(frozen=True)
class Drawn:
    """How one series is drawn: the dashboard's override for its name, as Grafana would."""

    name: str
    series: Series
    color: str
    linestyle: Any
    #: Line width in points: Grafana's ``custom.lineWidth`` (1 unless overridden) + 0.6.
    linewidth: float
    #: Stacking group (Grafana's ``custom.stacking.group``); None draws a plain line.
    group: str | None


def linestyle(line_style: Mapping[str, Any] | None) -> Any:
    """Grafana's ``custom.lineStyle`` as a matplotlib line style.

    Example:
        >>> linestyle(None), linestyle({"fill": "dash", "dash": [10, 10]})
        ('-', (0, (5.0, 5.0)))
    """
    if not line_style or line_style.get("fill", "solid") == "solid":
        return "-"
    if line_style["fill"] == "dot":
        return (0, (1.0, 2.5))
    return (0, tuple(v / 2 for v in line_style.get("dash", [10, 10])))


def drawn(panel: PanelData) -> list[Drawn]:
    """Every series of ``panel`` with its colour, line and stacking group: the panel's
    field overrides (generated from :mod:`kvobs.palette`), else the next of its others.

    Example:
        >>> from kvobs.report.fetch import TargetData
        >>> panel = PanelData("t", "timeseries", "short", "", [TargetData("{{tier}}", "q", [
        ...     Series({"tier": "gpu"}, []), Series({"tier": "x"}, [])])],
        ...     overrides={"gpu": {"color": {"fixedColor": "#56A64B"}}})
        >>> [(d.name, d.color) for d in drawn(panel)]
        [('gpu', '#56A64B'), ('x', '#D683CE')]
    """
    result, spare = [], 0
    default = {"mode": "normal" if panel.stacked else "none", "group": "A"}
    for target in panel.targets:
        for name, series in target.labelled():
            props = panel.overrides.get(name, {})
            color = props.get("color", {}).get("fixedColor")
            if color is None:
                color, spare = OTHERS[spare % len(OTHERS)], spare + 1
            stacking = props.get("custom.stacking", default)
            group = str(stacking.get("group", "A")) if stacking.get("mode") == "normal" else None
            result.append(Drawn(name, series, color, linestyle(props.get("custom.lineStyle")),
                                0.6 + float(props.get("custom.lineWidth", 1)), group))
    return result


class BinaryLocator(Locator):
    """Ticks at multiples of a power of two, for IEC byte axes (:func:`binary_ticks`)."""

    def __call__(self) -> Sequence[float]:
        vmin, vmax = self.axis.get_view_interval() if self.axis else (0.0, 1.0)
        return self.tick_values(vmin, vmax)

    def tick_values(self, vmin: float, vmax: float) -> Sequence[float]:
        low, high = sorted((vmin, vmax))
        return binary_ticks(low, high)


def _value_axis(axis: Any, unit: str) -> None:
    axis.set_major_formatter(FuncFormatter(lambda v, _p: format_value(v, unit)))
    if unit in BINARY_UNITS:
        axis.set_major_locator(BinaryLocator())


def _draw_stack(ax: Axes, members: Sequence[Drawn], alpha: float) -> None:
    grid = sorted({t for d in members for t, _v in d.series.finite_samples})
    base = np.zeros(len(grid))
    for d in members:
        values = dict(d.series.finite_samples)
        top = base + np.array([values.get(t, 0.0) for t in grid])
        ax.fill_between(grid, base, top, color=d.color, alpha=alpha, linewidth=0, label=d.name)
        ax.plot(grid, top, color=d.color, linestyle=d.linestyle, linewidth=d.linewidth - 0.4)
        base = top


def _draw_timeseries(ax: Axes, panel: PanelData) -> None:
    _value_axis(ax.yaxis, panel.unit)
    series = drawn(panel)
    groups: dict[str, list[Drawn]] = {}
    for d in series:
        if d.group is not None:
            groups.setdefault(d.group, []).append(d)
    for members in groups.values():  # stacks behind lines; stacks of tiers overlap
        _draw_stack(ax, members, alpha=0.75 if len(groups) == 1 else 0.45)
    for d in series:
        if d.group is None:
            ax.plot([t for t, _v in d.series.finite_samples],
                    [v for _t, v in d.series.finite_samples], label=d.name, linewidth=d.linewidth,
                    color=d.color, linestyle=d.linestyle)
    _time_axis(ax)
    ax.legend(fontsize=7, loc="upper left", ncol=2 if len(series) > 4 else 1, framealpha=0.7)
    ax.grid(alpha=0.3)
    if panel.unit == "percentunit":
        ax.set_ylim(0, 1.05)
    else:
        ax.set_ylim(bottom=0)


def _draw_stat(ax: Axes, panel: PanelData) -> None:
    series = drawn(panel)
    names = [d.name for d in series]
    values = [d.series.finite_samples[-1][1] for d in series]
    # a bar the palette does not name (a model, a what-if size) is grey, as Grafana's
    # uncoloured stat text: rainbow bars would suggest a meaning they do not have
    bars = ax.barh(names, values, color=[d.color if d.name in panel.overrides else NEUTRAL
                                         for d in series])
    for bar, value in zip(bars, values, strict=True):
        ax.text(max(bar.get_width(), 0), bar.get_y() + bar.get_height() / 2,
                " " + format_value(value, panel.unit) + _suffix(panel.unit), va="center",
                fontsize=9)
    _value_axis(ax.xaxis, panel.unit)
    low, high = min(0.0, *values), max(0.0, *values)
    ax.set_xlim(low * 1.35, high * 1.35 if high > 0 else (1 if low == 0 else 0))
    ax.invert_yaxis()


def _draw_verdict(ax: Axes, panel: PanelData) -> None:
    """The verdict in words above a stat panel that has one (:mod:`.verdict`)."""
    from kvobs.report.verdict import panel_verdict

    words = panel_verdict(panel)
    if words:  # under the panel's title, as its second line
        ax.set_title(f"{panel.title}\n{words[0].upper()}{words[1:]}", fontsize=10, loc="left",
                     fontweight="bold")


def _size(value: float, _pos: object = None) -> str:
    return f"{value:,.0f}"


def _draw_curve(ax: Axes, panel: PanelData) -> None:
    """One curve over a numeric label (the first query: the label in ``x_field``), sizes
    in numeric order on a log2 axis; each further query a size marked on that axis."""
    curve, *markers = panel.targets
    label = panel.x_field or "le"
    points = sorted((float(s.labels[label]), s.finite_samples[-1][1]) for s in curve.series
                    if s.labels.get(label, "+Inf") not in ("+Inf", "inf"))
    ax.plot([x for x, _y in points], [y for _x, y in points], marker="o", linewidth=2.2,
            color=tier_color("host"), label=curve.legend_format or "curve")
    for marker, dash in zip(markers, ("--", ":", "-."), strict=False):
        for name, series in marker.labelled()[:1]:
            size = series.finite_samples[-1][1]
            ax.axvline(size, color=tier_color({"GPU": "gpu"}.get(name, "host")), linestyle=dash,
                       linewidth=1.6, label=f"{name}: {size:,.0f} blocks")
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(FuncFormatter(_size))
    axis = panel.overrides.get(label, {})
    ax.set_xlabel(axis.get("custom.axisLabel") or axis.get("displayName", label), fontsize=8)
    _value_axis(ax.yaxis, panel.unit)
    ax.set_ylabel(describe(panel.unit), fontsize=8)
    if panel.unit == "percentunit":
        ax.set_ylim(0, 1.05)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right", framealpha=0.7)


def _suffix(unit: str) -> str:
    """Grafana shows an unknown unit id as a suffix (``s/s``): so does the report."""
    return f" {unit}" if "/" in unit else ""


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


def _draw_panel(ax: Axes, panel: PanelData, title: bool = True) -> None:
    if title:
        ax.set_title(panel.title, fontsize=11, loc="left", fontweight="bold")
    if panel.kind == "stat":
        _draw_stat(ax, panel)
        _draw_verdict(ax, panel)
    elif panel.kind == "xychart":
        _draw_curve(ax, panel)
    elif panel.kind == "heatmap":
        _draw_heatmap(ax, panel)
    else:
        _draw_timeseries(ax, panel)
        ax.set_ylabel(describe(panel.unit), fontsize=8)
    if panel.notes:
        ax.text(0.99, 0.02, "; ".join(panel.notes), transform=ax.transAxes,
                ha="right", va="bottom", fontsize=7, color="#777777")
    ax.tick_params(labelsize=7)


def _draw_copies(ax: Axes, panel: PanelData, copies: Sequence[tuple[str, PanelData]]) -> None:
    """A repeated panel: its copies side by side in one cell, as Grafana lays them out."""
    ax.axis("off")
    ax.set_title(panel.title.replace(f"${panel.repeat}", f"each {panel.repeat}"),
                 fontsize=11, loc="left", fontweight="bold")
    gap = 0.1
    width = (1 - gap * (len(copies) - 1)) / len(copies)
    for i, (value, copy) in enumerate(copies):
        inner = ax.inset_axes((i * (width + gap), 0, width, 0.9))
        inner.set_title(value, fontsize=9, loc="left", fontweight="bold",
                        color=tier_color(value) if panel.repeat == "tier" else "black")
        _draw_panel(inner, copy, title=False)
        if i:
            inner.set_ylabel("")
        inner.xaxis.set_major_locator(MaxNLocator(nbins=max(2, 6 // len(copies))))


def _umask() -> int:
    """The process umask (read by setting it, so set it straight back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def render_png(panels: Sequence[PanelData], out: Path, title: str, subtitle: str) -> None:
    """Draw ``panels`` into ``out`` (PNG), stacked where the dashboard stacks them."""
    rows, cols = grid_shape(len(panels))
    fig, axes = plt.subplots(rows, cols, figsize=(8.5 * cols, 3.9 * rows), squeeze=False)
    try:
        fig.suptitle(f"{title}\n{subtitle}", fontsize=14, y=0.995)
        for ax, panel in zip(axes.flat, panels, strict=False):
            copies = repeated(panel)
            if len(copies) == 1 and not panel.repeat:
                _draw_panel(ax, panel)
            else:
                _draw_copies(ax, panel, copies)
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
                    VERDICT_KEY: json.dumps(verdicts(panels)),
                })
            os.replace(tmp, out)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    finally:
        plt.close(fig)
