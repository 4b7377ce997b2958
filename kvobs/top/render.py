"""Draw endpoint views with rich: one panel per endpoint, readable from 40 columns up.

Each panel shows, top to bottom: the tiers (a bar per tier: in use in the tier's colour,
cached in its lighter shade, free as dots, then the numbers), the lookup split (where
looked-up tokens were found), the transfers per direction (throughput, p50 / p99
latency, drops and failures) and the health line (thrash onloads, wasted offloads,
instrumentation errors). Colours come from :mod:`kvobs.palette`, the same as the
report's and the dashboards'. The tables are as wide as their figures (the tier bars take
the rest); below 92 columns, or where a table's figures would not fit, they fold into two
short lines per tier or direction, so nothing is cut: a 100-column terminal shows every
figure, and a narrow one (40 columns and up) still reads.

Example:
    >>> from rich.console import Console
    >>> Console(width=48, color_system=None).print(
    ...     render_unreachable("http://127.0.0.1:1/metrics", "connection refused", 3))
    ╭─ http://127.0.0.1:1/metrics ─────────────────╮
    │ unreachable: connection refused              │
    │ retrying every refresh (3 failed so far)     │
    ╰──────────────────────────────────────────────╯
"""

from __future__ import annotations

from collections.abc import Sequence

from rich import box
from rich.cells import cell_len
from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from kvobs.palette import NEUTRAL, OUTCOMES, direction_color, tier_color
from kvobs.top.model import EndpointView, TierView, TransferView
from kvobs.units import format_value

#: Inner width (columns inside the panel border) from which the tables are drawn.
WIDE = 88
#: The narrowest tier bar of the table (its header's width); a table that leaves less folds.
_MIN_BAR = 20
#: Columns between two table columns (``padding=(0, 1)``, no edge padding).
_GAP = 2
_MISS = OUTCOMES["miss"]


def bar(parts: Sequence[tuple[float, str, str]], width: int, total: float) -> Text:
    """A horizontal bar of ``width`` cells: ``(value, character, colour)`` parts of ``total``.

    Example:
        >>> bar([(5, "█", "green"), (3, "▒", "green")], 10, 10).plain
        '█████▒▒▒··'
    """
    text = Text()
    used = 0
    if total > 0 and width > 0:
        for value, char, color in parts:
            cells = min(width - used, round(width * max(value, 0.0) / total))
            if cells > 0:
                text.append(char * cells, style=color)
                used += cells
    text.append("·" * max(0, width - used), style=NEUTRAL)
    return text


def _count(value: float) -> str:
    return format_value(value, "short")


def _bytes(value: float) -> str:
    return format_value(value, "bytes")


def _latency(value: float | None) -> str:
    return "-" if value is None else format_value(value, "s")


def _table_width(header: Sequence[str], rows: Sequence[Sequence[str | Text]]) -> int:
    """Columns a table of these cells takes (each column as wide as its widest cell)."""
    widths = [max(cell_len(str(cell)) for cell in column)
              for column in zip(header, *rows, strict=True)]
    return sum(widths) + _GAP * (len(widths) - 1)


def _tier_bar(tier: TierView, width: int) -> Text:
    return bar([(tier.in_use, "█", tier_color(tier.name)),
                (tier.cached, "▒", tier_color(tier.name, "cached"))], width, tier.capacity)


def _tiers(view: EndpointView, width: int) -> RenderableType:
    if not view.tiers:
        return Text("no tiers reported yet", style="dim")
    header = ("tier", "in use", "cached", "free", "capacity", "bytes used")
    rows = [(tier.name, _count(tier.in_use), _count(tier.cached), _count(tier.free),
             _count(tier.capacity),
             f"{_bytes(tier.in_use_bytes + tier.cached_bytes)} / {_bytes(tier.capacity_bytes)}")
            for tier in view.tiers]
    bar_width = width - _table_width(header, rows) - _GAP
    if width < WIDE or bar_width < _MIN_BAR:
        return _tier_lines(view.tiers, width)
    table = Table(box=None, pad_edge=False, expand=False, show_edge=False, padding=(0, 1))
    table.add_column("tier", no_wrap=True)
    table.add_column("█ use ▒ cache · free", no_wrap=True, width=bar_width)
    for name in header[1:]:
        table.add_column(name, justify="right", no_wrap=True)
    for tier, (name, *figures) in zip(view.tiers, rows, strict=True):
        table.add_row(Text(name, style=f"bold {tier_color(name)}"), _tier_bar(tier, bar_width),
                      *figures)
    return table


def _tier_lines(tiers: Sequence[TierView], width: int) -> RenderableType:
    """Two short lines per tier: the bar and its share, then the figures."""
    name_width = max(5, *(cell_len(tier.name) + 1 for tier in tiers))
    lines = []
    for tier in tiers:
        share = (tier.in_use + tier.cached) / tier.capacity if tier.capacity else 0.0
        head = Text(f"{tier.name:<{name_width}}", style=f"bold {tier_color(tier.name)}")
        lines.append(head + _tier_bar(tier, max(6, width - name_width - 5))
                     + Text(f" {share:4.0%}"))
        lines.append(Text(f"      use {_count(tier.in_use)} cache {_count(tier.cached)} "
                          f"free {_count(tier.free)}", style="dim"))
    return Group(*lines)


def _hits(view: EndpointView, width: int) -> RenderableType:
    total = sum(view.lookup_tokens.values())
    label = "hits (since start)" if view.hits_since_start else "hits (last interval)"
    if total <= 0:
        return Text(f"{label}: no lookups yet", style="dim")
    colors = {o: OUTCOMES[o] for o in OUTCOMES}
    shown = [(o, v) for o, v in view.lookup_tokens.items() if v > 0]
    legend = Text()
    for outcome, value in shown:
        legend.append(f" {outcome.replace('_hit', '')} ", style=f"bold {colors[outcome]}")
        legend.append(f"{value / total:.0%}")
    split = bar([(v, "█", colors[o]) for o, v in shown], max(10, min(width - 4, 60)), total)
    rate = ""
    if view.lookups_per_s is not None and not view.hits_since_start:
        rate = f"  {_count(total)} tok/s, {_count(view.lookups_per_s)} lookups/s"
    head = Text(label + ":", style="bold")
    if width < WIDE or cell_len(head.plain + legend.plain + rate) > width:
        # the legend on its own line, so that it never wraps mid-item
        return Group(head + Text(rate, style="dim"), legend, split)
    return Group(head + legend + Text(rate, style="dim"), split)


def _transfer_name(t: TransferView) -> Text:
    return Text(f"{t.src}→{t.dst}", style=f"bold {direction_color(t.src, t.dst)}")


def _losses(t: TransferView) -> Text:
    parts = []
    for what, per_s, total in (("drop", t.drops_per_s, t.drops),
                               ("fail", t.failures_per_s, t.failures)):
        style = "bold red" if per_s > 0 else ("yellow" if total > 0 else "dim")
        parts.append(Text(f"{what} {_count(per_s)}/s ({_count(total)})", style=style))
    return Text(" ").join(parts)


def _transfers(view: EndpointView, width: int) -> RenderableType:
    if not view.transfers:
        return Text("transfers: none yet", style="dim")
    header = ("transfer", "throughput", "blocks/s", "p50", "p99",
              "drops / failures per s (total)")
    rows = [(_transfer_name(t), format_value(t.bytes_per_s, "Bps"), _count(t.blocks_per_s),
             Text(_latency(t.p50_s), style="dim" if t.latency_since_start else ""),
             Text(_latency(t.p99_s), style="dim" if t.latency_since_start else ""),
             _losses(t))
            for t in view.transfers]
    if width < WIDE or _table_width(header, rows) > width:
        lines = []
        for name, throughput, _blocks, p50, p99, losses in rows:
            lines.append(name + Text(f" {throughput} p50 {p50.plain} p99 {p99.plain}"))
            lines.append(Text("  ") + losses)
        return Group(*lines)
    table = Table(box=None, pad_edge=False, show_edge=False, padding=(0, 1))
    table.add_column(header[0], no_wrap=True)
    for column in header[1:5]:
        table.add_column(column, justify="right", no_wrap=True)
    table.add_column(header[5], no_wrap=True)
    for row in rows:
        table.add_row(*row)
    return table


def _health(view: EndpointView, width: int) -> Text:
    """Thrash, wasted offloads and instrumentation errors: on one line where they fit,
    else one a line (never one broken in two)."""
    thrash_rate = view.thrash_per_s or 0.0
    thrash = Text.assemble(("thrash ", "bold"), (
        f"{_count(thrash_rate)}/s ({_count(view.thrash)})",
        "bold red" if thrash_rate > 0 else ""))
    share = view.wasted_share
    wasted = Text.assemble(
        ("wasted offloads ", "bold"),
        ("-" if share is None else f"{share:.0%}",
         "bold red" if share is not None and share > 0.5 else ""),
        f" ({_count(view.evicted_unused)} evicted unused, {_count(view.reused)} reused)")
    items = [thrash, wasted]
    if view.instrumentation_errors:
        items.append(Text(f"instrumentation errors {_count(view.instrumentation_errors)}",
                          style="bold red"))
    one_line = Text("  ").join(items)
    return one_line if cell_len(one_line.plain) <= width else Text("\n").join(items)


def render_view(view: EndpointView, width: int) -> Panel:
    """The panel of one reachable endpoint, laid out for ``width`` columns."""
    inner = max(20, width - 4)
    body = Group(_tiers(view, inner), Text(""), _hits(view, inner), Text(""),
                 _transfers(view, inner), _health(view, inner))
    every = f"rates over {view.interval_s:.1f} s" if view.interval_s else "first scrape"
    return Panel(body, title=Text(view.title, style="bold"), title_align="left",
                 subtitle=Text(f"{view.url} · {every}", style="dim"), subtitle_align="right",
                 box=box.ROUNDED, width=width)


def render_unreachable(url: str, reason: str, attempts: int) -> Panel:
    """The panel of an endpoint that did not answer: why, and that it is retried."""
    body = Text.assemble(("unreachable", "bold red"), f": {reason}\n",
                         (f"retrying every refresh ({attempts} failed so far)", "dim"))
    return Panel(body, title=Text(url, style="bold"), title_align="left", box=box.ROUNDED,
                 border_style=_MISS)


def render_screen(panels: Sequence[RenderableType], footer: str,
                  keys: bool = True) -> RenderableType:
    """All panels stacked, then ``footer``, after the key help when ``keys`` are read."""
    help_ = "q quit · Ctrl-C quit · " if keys else ""
    return Group(*panels, Text(f" {help_}{footer}", style="dim"))
