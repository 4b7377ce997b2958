"""The host pool's verdict in words, from the *Net benefit* panel's latest values.

The host-pool dashboard's verdict panel has three queries: ``saves`` (prefill seconds
per second its hits save, absent while no prefill cost is known), ``onload`` (onload
seconds per second they cost) and ``net`` (the difference, absent where either side is
unknown). The report writes them as one sentence a person reads at a glance; an unknown
saving is said to be unknown, with what to do about it, never 0.

Example:
    >>> sentence({"saves": 0.13, "onload": 0.004, "net": 0.126})
    'the host pool saves 0.13 s of prefill per second for 0.004 s of onload (net +0.126 s/s)'
    >>> sentence({"saves": 0.13, "onload": 0.0}).split(" (")[0]
    "the host pool's net benefit is unknown"
    >>> said = sentence({"onload": 0.004}, cost_unknown=True)
    >>> said.split(" (")[0], "KVOBS_PREFILL_SECONDS_PER_TOKEN" in said
    ("the host pool's net benefit is unknown: no prefill cost is known yet", True)
    >>> sentence({"onload": 0.004}) is None
    True
"""

from __future__ import annotations

from collections.abc import Mapping

from kvobs.misses import CAUSE_LEGEND, RECOVERABLE_LEGEND, miss_sentence
from kvobs.report.fetch import MAY_BE_UNKNOWN, PanelData

#: The legends of the verdict panel's queries.
SAVES, ONLOAD, NET = "saves", "onload", "net"
#: What to do while the prefill cost is unknown (:mod:`kvobs.benefit`).
COST_HINT = ("set KVOBS_PREFILL_SECONDS_PER_TOKEN to the engine's prefill seconds per prompt "
             "token, or wait for the measured cost")


def _seconds(value: float) -> str:
    return f"{value:.3g}"


def sentence(latest: Mapping[str, float], cost_unknown: bool = False) -> str | None:
    """The verdict from the latest ``saves`` / ``onload`` / ``net`` values;
    ``cost_unknown``: the ``saves`` query had no value, no prefill cost being known
    (None: not the verdict panel, or its onload time is unknown too)."""
    onload = latest.get(ONLOAD)
    if cost_unknown:
        said = "" if onload is None else f"; {_seconds(onload)} s of onload per second"
        return (f"the host pool's net benefit is unknown: no prefill cost is known yet "
                f"({COST_HINT}){said}")
    if SAVES not in latest or onload is None:
        return None
    saves, net = _seconds(latest[SAVES]), latest.get(NET)
    if net is None:
        return ("the host pool's net benefit is unknown (onloads the engine does not time): "
                f"{saves} s of prefill saved per second, {_seconds(onload)} s of onload")
    return (f"the host pool saves {saves} s of prefill per second for {_seconds(onload)} s "
            f"of onload (net {net:+.3g} s/s)")


def panel_verdict(panel: PanelData) -> str | None:
    """The sentence for a panel with ``saves`` and ``onload`` queries (``saves`` noted
    unknown by the fetch where it had no value), or one of miss causes' shares
    (:func:`misses_verdict`), else None."""
    if any(target.legend_format == CAUSE_LEGEND for target in panel.targets):
        return misses_verdict(panel)
    latest = {target.legend_format: series.finite_samples[-1][1]
              for target in panel.targets for series in target.series[:1]
              if series.finite_samples}
    return sentence(latest, cost_unknown=MAY_BE_UNKNOWN[SAVES] in panel.notes)


def misses_verdict(panel: PanelData) -> str | None:
    """The sentence for a panel of each miss cause's share of the looked-up tokens (the
    *Looked-up tokens over the window* stat), from its latest values; None while
    it has none.

    Example:
        >>> from kvobs.report.fetch import TargetData
        >>> from kvobs.report.prometheus_api import Series
        >>> shares = [Series({"cause": c}, [(0.0, v)]) for c, v in (("cold", 0.2),
        ...                                                          ("evicted", 0.1))]
        >>> won = [Series({}, [(0.0, 0.04)])]
        >>> said = misses_verdict(PanelData("t", "stat", "percentunit", "", [
        ...     TargetData(CAUSE_LEGEND, "q", shares), TargetData(RECOVERABLE_LEGEND, "q", won)]))
        >>> said.split(": ")[1]
        '20% never seen, 10% evicted (2x the capacity wins back 4 points)'
    """
    shares = {series.labels.get("cause", ""): series.finite_samples[-1][1]
              for target in panel.targets if target.legend_format == CAUSE_LEGEND
              for series in target.series if series.finite_samples}
    recoverable = [series.finite_samples[-1][1] for target in panel.targets
                   if target.legend_format == RECOVERABLE_LEGEND
                   for series in target.series if series.finite_samples]
    return miss_sentence(1.0, shares, recoverable[0] if recoverable else None) \
        if shares else None
