"""The PromQL reader that keeps dashboards and rules on catalog metrics."""

from __future__ import annotations

from kvobs.dashboards.promql import (
    GPU_ONLY_METRICS,
    metric_names,
    problems,
    substitute,
    unresolved_variables,
)


def test_metric_names_skip_functions_labels_strings_and_numbers() -> None:
    expr = (
        "histogram_quantile(0.99, sum by (le, src_tier) (rate("
        'kvobs_transfer_duration_seconds_bucket{tier=~"gpu|host", x="kvobs_fake"}[5m])))'
        " / on (src_tier) group_left () (kvobs_tier_capacity_bytes > 1e-9)"
    )
    assert metric_names(expr) == [
        "kvobs_transfer_duration_seconds_bucket",
        "kvobs_tier_capacity_bytes",
    ]


def test_recording_rule_names_are_metric_names() -> None:
    assert metric_names('instance:kvobs_thrash_ratio:rate5m{job="a"} > 0.5') == [
        "instance:kvobs_thrash_ratio:rate5m"
    ]


def test_problems_flag_counters_outside_rate_and_bare_histograms() -> None:
    assert problems("sum(kvobs_lookups_total)") == [
        "reads counter 'kvobs_lookups_total' outside rate()/increase()/absent()"
    ]
    assert problems("kvobs_transfer_duration_seconds") == [
        "reads histogram 'kvobs_transfer_duration_seconds' directly: use "
        "kvobs_transfer_duration_seconds_bucket/_sum/_count"
    ]
    assert problems("sum(rate(kvobs_lookups_total[1m])) + absent(kvobs_lookups_total)") == []
    assert problems("instance:x:rate1m", recorded=["instance:x:rate1m"]) == []
    assert problems("up == 0") == []


def test_substitute_fills_every_form_and_longest_name_first() -> None:
    expr = 'rate(m{job=~"$job", j2=~"${job}"}[$__rate_interval]) offset $__rate'
    filled = substitute(expr, {"job": "a|b", "__rate_interval": "30s", "__rate": "1m"})
    assert filled == 'rate(m{job=~"a|b", j2=~"a|b"}[30s]) offset 1m'
    assert unresolved_variables(filled) == []
    assert unresolved_variables('m{x="$model"}') == ["model"]


def test_gpu_only_metrics_come_from_the_catalog() -> None:
    assert "kvobs_pcie_peak_bandwidth_bytes_per_second" in GPU_ONLY_METRICS
    assert "kvobs_lookups_total" not in GPU_ONLY_METRICS
