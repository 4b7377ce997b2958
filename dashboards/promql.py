"""Just enough PromQL reading to keep dashboards and rules honest.

Dashboards and rules are generated from Python, but their queries are still text. This
module reads that text back: which metric names a query selects, whether every one of
them is in the catalog (or is a kvobs recording rule), whether counters are only read
through ``rate()``/``increase()`` and histograms only through ``_bucket``/``_sum``/
``_count``, and how a query looks with its Grafana variables filled in.

It is a tokenizer, not a parser: string literals, label matchers, range selectors and
grouping clauses are cut out, and what is left that looks like an identifier and is not
a function or keyword is a metric name. That is exact for the queries kvobs writes.

Example:
    >>> metric_names('sum by (tier) (rate(kvobs_block_reuses_total{job=~"$job"}[5m]))')
    ['kvobs_block_reuses_total']
    >>> problems('rate(kvobs_no_such_metric[1m])')
    ["names 'kvobs_no_such_metric', which is not in kvobs.catalog.METRICS"]
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from kvobs.catalog import FLEET_METRICS, METRICS, MetricSpec

#: Series Prometheus itself creates for every scrape target.
PROMETHEUS_BUILTINS: frozenset[str] = frozenset({"up"})

#: Metrics read from NVML: absent where the exporter runs without a GPU (CI, the demo).
#: The series only ``kvobs fleet`` exports (never an engine's exporter).
FLEET_ONLY_METRICS: frozenset[str] = frozenset(spec.name for spec in FLEET_METRICS)
GPU_ONLY_METRICS: frozenset[str] = frozenset(
    spec.name for spec in METRICS if spec.name.startswith(("kvobs_gpu_", "kvobs_pcie_"))
)

_HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
_KEYWORDS = frozenset(
    ["by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or",
     "unless", "offset", "atan2", "inf", "nan"]
)
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGES = re.compile(r"\[[^\[\]]*\]")
_GROUPING = re.compile(
    r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)", re.IGNORECASE
)
_NUMBER = re.compile(r"(?<![\w:])\d+(?:\.\d+)?(?:[eE][+-]?\d+)?")
_IDENTIFIER = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_RATE_CALL = r"\b(?:rate|irate|increase|absent)\s*\(\s*"


def metric_names(expr: str) -> list[str]:
    """Metric (and recording rule) names selected by ``expr``, in order, without repeats."""
    text = _STRING.sub(" ", expr)
    text = _MATCHERS.sub(" ", text)
    text = _RANGES.sub(" ", text)
    text = _GROUPING.sub(" ", text)
    text = _NUMBER.sub(" ", text)
    names: list[str] = []
    for match in _IDENTIFIER.finditer(text):
        word = match.group(0)
        is_call = text[match.end():].lstrip().startswith("(")
        if is_call or word.lower() in _KEYWORDS or word in names:
            continue
        names.append(word)
    return names


def catalog_spec(name: str) -> MetricSpec | None:
    """The catalog entry a selected series name belongs to (``_bucket`` -> histogram)."""
    specs = {spec.name: spec for spec in (*METRICS, *FLEET_METRICS)}
    if name in specs:
        return specs[name]
    for suffix in _HISTOGRAM_SUFFIXES:
        base = name.removesuffix(suffix)
        if base != name and base in specs and specs[base].kind == "histogram":
            return specs[base]
    return None


def problems(expr: str, recorded: Iterable[str] = ()) -> list[str]:
    """Why ``expr`` is not a query kvobs should ship; empty when it is fine.

    Args:
        expr: a PromQL expression.
        recorded: names of kvobs recording rules, which queries may also select.
    """
    found: list[str] = []
    recorded = set(recorded)
    for name in metric_names(expr):
        if name in recorded or name in PROMETHEUS_BUILTINS:
            continue
        spec = catalog_spec(name)
        if spec is None:
            found.append(f"names {name!r}, which is not in kvobs.catalog.METRICS")
        elif spec.kind == "histogram" and name == spec.name:
            found.append(f"reads histogram {name!r} directly: use {name}_bucket/_sum/_count")
        elif spec.kind == "counter" and not re.search(_RATE_CALL + re.escape(name) + r"\b", expr):
            found.append(f"reads counter {name!r} outside rate()/increase()/absent()")
        elif spec.kind == "histogram" and not re.search(
            _RATE_CALL + re.escape(name) + r"\b", expr
        ):
            found.append(f"reads histogram series {name!r} outside rate()/increase()")
    return found


def substitute(expr: str, variables: Mapping[str, str]) -> str:
    """``expr`` with Grafana variables (``$name`` and ``${name}``) replaced.

    Longer names are replaced first so ``$__rate_interval`` never matches ``$__rate``.

    Example:
        >>> substitute('x{job=~"$job"}[$__rate_interval]', {"job": ".*", "__rate_interval": "5s"})
        'x{job=~".*"}[5s]'
    """
    for name in sorted(variables, key=len, reverse=True):
        value = variables[name]
        expr = expr.replace("${" + name + "}", value)
        expr = re.sub(r"\$" + re.escape(name) + r"(?![A-Za-z0-9_])", value.replace("\\", "\\\\"),
                      expr)
    return expr


def unresolved_variables(expr: str) -> list[str]:
    """Grafana variables still present in ``expr`` (so a caller can say which one is missing)."""
    return sorted(set(re.findall(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)", expr)))
