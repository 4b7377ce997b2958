"""The host pool's verdict in words, from the *Net benefit* panel's latest values.

The host-pool dashboard's verdict panel has three queries: ``saves`` (prefill seconds
per second its hits save), ``onload`` (onload seconds per second they cost) and ``net``
(the difference, absent where either side is unknown). The report writes them as one
sentence a person reads at a glance.

Example:
    >>> sentence({"saves": 0.13, "onload": 0.004, "net": 0.126})
    'the host pool saves 0.13 s of prefill per second for 0.004 s of onload (net +0.126 s/s)'
    >>> sentence({"saves": 0.0, "onload": 0.004}).split(" (")[0]
    "the host pool's net benefit is unknown"
    >>> sentence({"onload": 0.004}) is None
    True
"""

from __future__ import annotations

from collections.abc import Mapping

from kvobs.report.fetch import PanelData

#: The legends of the verdict panel's queries.
SAVES, ONLOAD, NET = "saves", "onload", "net"


def _seconds(value: float) -> str:
    return f"{value:.3g}"


def sentence(latest: Mapping[str, float]) -> str | None:
    """The verdict from the latest ``saves`` / ``onload`` / ``net`` values (None: the
    saving or the onload time is unknown, e.g. no prefill cost is known)."""
    if SAVES not in latest or ONLOAD not in latest:
        return None
    saves, onload, net = _seconds(latest[SAVES]), _seconds(latest[ONLOAD]), latest.get(NET)
    if net is None:
        return ("the host pool's net benefit is unknown (no prefill cost known, or onloads "
                f"the engine does not time): {saves} s of prefill saved per second, {onload} "
                "s of onload")
    return (f"the host pool saves {saves} s of prefill per second for {onload} s of onload "
            f"(net {net:+.3g} s/s)")


def panel_verdict(panel: PanelData) -> str | None:
    """The sentence for a panel with ``saves`` and ``onload`` queries, else None."""
    latest = {target.legend_format: series.finite_samples[-1][1]
              for target in panel.targets for series in target.series[:1]
              if series.finite_samples}
    return sentence(latest)
