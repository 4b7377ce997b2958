"""Prometheus recording rules: per-instance ratios and rates, and fleet sums per model.

Names follow the ``level:metric:operation`` convention. Ratios divide only where the
denominator is positive, so an idle instance has no sample rather than NaN. Alerts
(:mod:`.alert_rules`) and the fleet sums read the ``instance:`` rules.

Example:
    >>> [rule["record"] for rule in groups()[0]["rules"]][:2]
    ['instance:kvobs_lookup_tokens:rate1m', 'instance:kvobs_lookup_hit_ratio:rate1m']
"""

from __future__ import annotations

from typing import Any

#: Labels that identify one engine instance (namespace is absent outside Kubernetes).
INSTANCE = "namespace, job, instance, engine, model"
#: One process of an engine: its instance, and its data- and tensor-parallel ranks where it
#: has them (SGLang and LMCache run a process per TP rank, each counting the batch's
#: tokens; a vLLM data-parallel rank is an engine of its own, even where its processes
#: share one scrape target's ``instance``).
PROCESS = f"{INSTANCE}, dp_rank, tp_rank"
#: One process per engine: its only one, or its tensor-parallel rank 0 (SGLang, LMCache
#: ranks each see the whole batch).
ENGINE_PROCESS = 'tp_rank=~"|0"'

_ONLOAD = 'src_tier="host", dst_tier="gpu"'


def host_pool_net_benefit(by: str, window: str) -> str:
    """Prefill seconds per second the host pool's hits save, minus the onload seconds
    they cost, per process (``by``: labels every real scrape has, so a saving and its
    onloads, counted in the same process, always join).

    No sample where either side is unknown, never a guess: the prefill cost is unknown
    (``source="none"``, or no ``kvobs_prefill_cost_info`` at all), the onload series is
    absent, or blocks were onloaded in the window without any onload seconds (an engine
    that does not time its copies, e.g. SGLang without CUDA timing events). A window
    without onloads costs 0 s. While the cost is unknown the saving counter stays at 0
    and the hits are held (:mod:`kvobs.benefit`): the first cost credits them in one
    step, so the windows that hold that step answer with the held saving as well.
    """
    saved = f'sum by ({by}) (rate(kvobs_prefill_saved_seconds_total{{tier="host"}}[{window}]))'
    seconds = f"sum by ({by}) (rate(kvobs_transfer_seconds_total{{{_ONLOAD}}}[{window}]))"
    blocks = f"sum by ({by}) (rate(kvobs_transfer_blocks_total{{{_ONLOAD}}}[{window}]))"
    onload = f"(({seconds}) > 0\n   or ({seconds}) and on ({by}) (({blocks}) == 0))"
    known = f'max by ({by}) (kvobs_prefill_cost_info{{source!="none"}})'
    return f"({saved}\n - on ({by}) {onload})\nand on ({by}) ({known} > 0)"


def reuse_hit_ratio(by: str, window: str) -> str:
    """Predicted LRU hit ratio per cache size ``le`` (blocks) from the sampled reuse
    profile, with the SHARDS-adj correction (see kvobs.reuse.adjusted_hit_ratio)."""
    sampled = "kvobs_reuse_sampled_references_total"
    expected = (f"sum by ({by}) (rate(kvobs_reuse_references_total[{window}]) "
                f"* on ({INSTANCE}) group_left () max by ({INSTANCE}) (kvobs_reuse_sample_rate))")
    every = f'sum by ({by}) (rate({sampled}{{le="+Inf"}}[{window}]))'
    hits = f'sum by ({by}, le) (rate({sampled}{{le!="+Inf"}}[{window}]))'
    return (f"clamp(\n  ({hits} + ignoring (le) group_left () ({expected} - {every}))\n"
            f"  / ignoring (le) group_left () ({expected} > 0),\n  0, 1)")


def _rule(record: str, expr: str) -> dict[str, Any]:
    return {"record": record, "expr": expr}


def instance_rules() -> list[dict[str, Any]]:
    """Rules per engine instance."""
    tokens = "instance:kvobs_lookup_tokens:rate1m"
    reused = f"sum by ({INSTANCE}) (rate(kvobs_offloaded_reused_blocks_total[5m]))"
    wasted = f"sum by ({INSTANCE}) (rate(kvobs_offloaded_evicted_unused_blocks_total[5m]))"
    return [
        _rule(tokens,
              f"sum by ({INSTANCE}, outcome) (rate(kvobs_lookup_tokens_total[1m]))"),
        # Share of looked-up tokens each tier served; the tier label comes from the outcome.
        _rule("instance:kvobs_lookup_hit_ratio:rate1m",
              f'sum without (outcome) (label_replace({tokens}{{outcome=~".+_hit"}}, '
              f'"tier", "$1", "outcome", "(.+)_hit"))\n'
              f"/ ignoring (tier) group_left ()\n"
              f"(sum by ({INSTANCE}) ({tokens}) > 0)"),
        _rule("instance:kvobs_lookup_miss_ratio:rate1m",
              f'sum by ({INSTANCE}) ({tokens}{{outcome="miss"}})\n'
              f"/ (sum by ({INSTANCE}) ({tokens}) > 0)"),
        _rule("instance:kvobs_transfer_bandwidth_bytes:rate1m",
              f"sum by ({INSTANCE}, src_tier, dst_tier) (rate(kvobs_transfer_bytes_total[1m]))"),
        _rule("instance:kvobs_transfer_duration_seconds:p99_rate5m",
              f"histogram_quantile(0.99, sum by ({INSTANCE}, src_tier, dst_tier, le) "
              f"(rate(kvobs_transfer_duration_seconds_bucket[5m]))\n"
              f"  and on ({INSTANCE}, src_tier, dst_tier)\n"
              f"  (sum by ({INSTANCE}, src_tier, dst_tier) "
              f"(rate(kvobs_transfer_duration_seconds_count[5m])) > 0))"),
        # Share of onloaded blocks that bounced back within the thrash window.
        _rule("instance:kvobs_thrash_ratio:rate5m",
              f"sum by ({INSTANCE}) (rate(kvobs_thrash_onloads_total[5m]))\n"
              f"/ (sum by ({INSTANCE}) (rate(kvobs_transfer_blocks_total{{{_ONLOAD}}}[5m])) > 0)"),
        # Share of offloads evicted from the host tier before any reuse.
        _rule("instance:kvobs_offload_waste_ratio:rate5m",
              f"{wasted}\n/ (({reused} + {wasted}) > 0)"),
        _rule("instance:kvobs_tier_occupancy:ratio",
              f"sum by ({INSTANCE}, tier) (kvobs_tier_resident_blocks)\n"
              f"/ (sum by ({INSTANCE}, tier) (kvobs_tier_capacity_blocks) > 0)"),
        # Seconds of prefill saved per second by host hits, minus their onload seconds.
        _rule("instance:kvobs_host_pool_net_benefit_seconds:rate5m",
              host_pool_net_benefit(PROCESS, "5m")),
        # What-if: the hit ratio an LRU cache of `le` blocks would get.
        _rule("instance:kvobs_reuse_hit_ratio:rate1h", reuse_hit_ratio(INSTANCE, "1h")),
    ]


def fleet_rules() -> list[dict[str, Any]]:
    """Sums over all instances serving one model."""
    tokens = "model:kvobs_lookup_tokens:rate1m"
    return [
        _rule(tokens, "sum by (model, outcome) (instance:kvobs_lookup_tokens:rate1m)"),
        _rule("model:kvobs_lookup_hit_ratio:rate1m",
              f'sum by (model) ({tokens}{{outcome!="miss"}})\n'
              f"/ (sum by (model) ({tokens}) > 0)"),
        _rule("model:kvobs_transfer_bandwidth_bytes:rate1m",
              "sum by (model, src_tier, dst_tier) "
              "(instance:kvobs_transfer_bandwidth_bytes:rate1m)"),
        _rule("model:kvobs_tier_capacity_bytes:sum",
              "sum by (model, tier) (kvobs_tier_capacity_bytes)"),
        _rule("model:kvobs_tier_resident_bytes:sum",
              "sum by (model, tier, state) (kvobs_tier_resident_bytes)"),
        # An engine's tokens once: its only process, or its tensor-parallel rank 0.
        _rule("model:kvobs_host_pool_net_benefit_seconds:rate5m",
              "sum by (model) (instance:kvobs_host_pool_net_benefit_seconds:rate5m"
              f"{{{ENGINE_PROCESS}}})"),
        _rule("model:kvobs_reuse_hit_ratio:rate1h", reuse_hit_ratio("model", "1h")),
    ]


def groups() -> list[dict[str, Any]]:
    """The rule groups of ``kvobs-recording.rules.yaml``."""
    return [
        {"name": "kvobs.instance", "rules": instance_rules()},
        {"name": "kvobs.fleet", "rules": fleet_rules()},
    ]


def recorded_names() -> list[str]:
    """Every series name these rules record (dashboards may select them)."""
    return [rule["record"] for group in groups() for rule in group["rules"]]
