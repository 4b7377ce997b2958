"""The *Fleet cache* dashboard: what the replicas of a model hold, once or twice, and what
routing by prefix would win, from ``kvobs fleet``'s series (the engines' KV events).

It needs no kvobs plugin in the engines: every panel reads ``kvobs_fleet_*``, which one
``kvobs fleet`` process exports for the replicas it follows (docs/fleet.md).

Example:
    >>> dashboard().uid
    'kvobs-fleet-cache'
"""

from __future__ import annotations

from grafanalib.core import Dashboard

from .panels import Query, Section, kvobs_dashboard, stat, timeseries
from .queries import rate, ratio, series, sum_by

UID = "kvobs-fleet-cache"
TITLE = "kvobs / Fleet cache"


def _duplication() -> Section:
    return Section("What the fleet holds twice", [
        stat("Blocks held by two or more replicas",
             "KV blocks resident on at least two replicas, per tier: each is a prefix the "
             "router spreads over replicas (or a system prompt every replica needs).",
             "short",
             [Query(sum_by("tier", series("kvobs_fleet_duplicated_blocks")), "{{tier}}")]),
        timeseries("Share of each tier spent on duplicate copies",
                   "Copies beyond the first of blocks held by several replicas, over all "
                   "blocks the replicas hold in the tier: capacity a pooled cache (or "
                   "routing by prefix) would free for other prefixes.",
                   "percentunit",
                   [Query(ratio(sum_by("tier", series("kvobs_fleet_duplicate_copies_blocks")),
                                sum_by("tier", series("kvobs_fleet_resident_blocks"))),
                          "{{tier}}")],
                   ratio=True),
        timeseries("Resident blocks per tier",
                   "KV blocks all replicas hold in each tier, copies counted, from their own "
                   "KV events (no kvobs plugin needed in the engines).",
                   "short",
                   [Query(sum_by("tier", series("kvobs_fleet_resident_blocks")), "{{tier}}")]),
        timeseries("GPU blocks per replica",
                   "KV blocks each replica holds on its GPU, from its KV events: a replica "
                   "far from its siblings gets another share of the traffic.",
                   "short",
                   [Query(sum_by("replica", series("kvobs_fleet_resident_blocks",
                                                   'tier="gpu"')), "{{replica}}")]),
    ])


def _routing() -> Section:
    computed = rate("kvobs_fleet_computed_tokens_total")
    return Section("What routing by prefix would win", [
        timeseries("Why replicas computed tokens",
                   "Tokens per second the replicas computed and stored on their GPUs, by why "
                   "no copy served them: routing (another replica held the block: a prefix "
                   "router would have sent the request there), evicted (this replica held "
                   "it before), evicted_elsewhere (only other replicas did), cold (no "
                   "replica held it before).",
                   "short",
                   [Query(sum_by("cause", computed), "{{cause}}")],
                   stacked=True, axis_label="tokens/s"),
        stat("Computed tokens routing by prefix would have served",
             "Share of the tokens the replicas computed that another replica held at the "
             "time: the prefill a prefix-aware router saves, at the fleet's capacity.",
             "percentunit",
             [Query(ratio(sum_by("model", rate("kvobs_fleet_computed_tokens_total",
                                               'cause="routing"')),
                          sum_by("model", computed)), "{{model}}")]),
        stat("Pooled what-if: block references one shared cache would hit",
             "With kvobs fleet --pooled-capacity: of the tokens of every block the replicas "
             "stored to their GPUs (computed, loaded, or reported reused), the share one LRU "
             "cache of that many blocks shared by the whole fleet would have hit (perfect "
             "prefix routing), from 1/8 to 16 times the fleet's capacity. Exact where the "
             "engines publish their prefix hits (vLLM's kv_cache_report_mode=full).",
             "percentunit",
             [Query(ratio(sum_by("blocks", rate("kvobs_fleet_pooled_hit_tokens_total")),
                          sum_by("", rate("kvobs_fleet_pooled_referenced_tokens_total")),
                          "ignoring (blocks) group_left ()"), "{{blocks}} blocks")],
             width=12),
        timeseries("Event streams",
                   "Per replica: gaps in its batch sequence lost (its blocks dropped from "
                   "the index until new events refill them) and events skipped (malformed "
                   "or unknown). Both should stay at zero.",
                   "short",
                   [Query(sum_by("model, replica", rate("kvobs_fleet_gaps_total",
                                                        'outcome="lost"')),
                          "lost gaps {{replica}}"),
                    Query(sum_by("model, replica", rate("kvobs_fleet_skipped_events_total")),
                          "skipped {{replica}}")],
                   axis_label="per second"),
    ])


def dashboard() -> Dashboard:
    """The *Fleet cache* dashboard as a grafanalib object."""
    return kvobs_dashboard(
        title=TITLE,
        uid=UID,
        description="What the replicas of a model hold once or twice, and what routing by "
                    "prefix would win, from the engines' KV events (kvobs fleet).",
        tags=["fleet"],
        refresh="1m",
        time_from="now-3h",
        sections=[_duplication(), _routing()],
    )
