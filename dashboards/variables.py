"""Template variables every kvobs dashboard offers, and the selector that uses them.

A dashboard opens on all kvobs targets of one Prometheus data source; the variables
narrow it to a namespace, a scrape job, an engine (vllm, sglang...), a model and one or
more engine instances. Every variable but the data source allows several values and
"All" (the regex ``.*``, which also matches series that lack the label, so the
``namespace`` variable is harmless where Prometheus does not attach one).

Example:
    >>> selector('tier="gpu"').split(", ")[-2:]
    ['instance=~"$instance"', 'tier="gpu"']
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from grafanalib.core import Template

#: Filter variables, outermost first; each one's values are restricted by those before it.
FILTERS: tuple[tuple[str, str, str], ...] = (
    ("namespace", "Namespace",
     "Kubernetes namespace of the engine pods (empty outside Kubernetes)."),
    ("job", "Job", "Prometheus scrape job that collects the kvobs exporter."),
    ("engine", "Engine", "Inference engine kvobs instruments: vllm, sglang, lmcache, demo..."),
    ("model", "Model", "Model served by the engine."),
    ("instance", "Instance", "Engine instance (scrape target host:port)."),
)

#: Variables a panel repeats over (one copy per value), not filters of every query:
#: occupancy is drawn once per tier, each tier's states stacked on their own.
REPEATS: tuple[tuple[str, str, str, str], ...] = (
    ("tier", "Tier", "KV cache tiers the per-tier occupancy panels repeat over.",
     "kvobs_tier_capacity_blocks"),
)

#: The data source variable; panels and targets refer to it as ``${datasource}``.
DATASOURCE = "datasource"

#: A series every kvobs exporter has from its first collection: variable values come
#: from its labels.
_PRESENCE_METRIC = "kvobs_lookups_total"

#: The value Grafana substitutes for "All" on a filter variable.
ALL = ".*"


def selector(*extra: str) -> str:
    """Label matchers for the filter variables, plus ``extra`` matchers."""
    matchers = [f'{name}=~"${name}"' for name, _label, _help in FILTERS]
    return ", ".join([*matchers, *extra])


def all_values(rate_interval: str = "1m", time_range: str = "1h") -> dict[str, str]:
    """Values Grafana substitutes with every filter on "All", for running queries outside it.

    Args:
        rate_interval: what ``$__rate_interval`` stands for (Grafana derives it from the
            scrape interval and the panel's resolution).
        time_range: what ``$__range`` stands for (the dashboard's time range).
    """
    values = {name: ALL for name, _label, _help in FILTERS}
    values |= {name: ALL for name, _label, _help, _metric in REPEATS}
    values["__rate_interval"] = rate_interval
    values["__range"] = time_range
    return values


def templates(repeats: Collection[str] = ()) -> list[Template]:
    """The data source variable followed by the chained filter variables, then the
    variables of :data:`REPEATS` named in ``repeats`` (those the dashboard's panels use)."""
    from grafanalib.core import Template

    result = [
        Template(
            name=DATASOURCE,
            label="Data source",
            type="datasource",
            query="prometheus",
            default="Prometheus",
        )
    ]
    for position, (name, label, _help) in enumerate(FILTERS):
        outer = [f'{n}=~"${n}"' for n, _l, _h in FILTERS[:position]]
        series = _PRESENCE_METRIC + ("{" + ", ".join(outer) + "}" if outer else "")
        result.append(_label_values(name, label, f"label_values({series}, {name})"))
    scope = "{" + selector() + "}"
    for name, label, _help, metric in REPEATS:
        if name not in repeats:
            continue
        result.append(_label_values(name, label, f"label_values({metric}{scope}, {name})"))
    return result


def descriptions() -> dict[str, str]:
    """Variable name -> description, written into the JSON by :mod:`.modern`."""
    return {name: help_ for name, _label, help_ in FILTERS} | {
        name: help_ for name, _label, help_, _metric in REPEATS} | {
        DATASOURCE: "Prometheus data source that scrapes the kvobs exporters."
    }


def _label_values(name: str, label: str, query: str) -> Template:
    """A multi-select variable over ``query``'s label values, "All" by default."""
    from grafanalib.core import Template

    return Template(
        name=name,
        label=label,
        type="query",
        dataSource="${" + DATASOURCE + "}",
        query=query,
        includeAll=True,
        multi=True,
        allValue=ALL,
        default="$__all",
        refresh=2,
        sort=1,
    )
