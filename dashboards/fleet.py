"""The *Fleet* dashboard: the key tier figures per engine instance and model.

One line per replica makes the odd one out visible: a replica with a lower hit ratio, a
fuller GPU tier or a slower onload path than its siblings serving the same model.

Example:
    >>> dashboard().uid
    'kvobs-fleet'
"""

from __future__ import annotations

from grafanalib.core import Dashboard

from .panels import Query, Section, kvobs_dashboard, stat, timeseries
from .queries import quantile, rate, ratio, series, sum_by
from .recording_rules import ENGINE_PROCESS

UID = "kvobs-fleet"
TITLE = "kvobs / Fleet"
_BY = "model, instance"
_LEGEND = "{{model}} @ {{instance}}"


def _overview() -> Section:
    tokens = rate("kvobs_lookup_tokens_total")
    return Section("Fleet overview", [
        stat("Engine instances reporting",
             "Engines whose kvobs exporter reports KV cache tiers, per model: one per engine "
             "(a vLLM engine core; a tensor-parallel group's rank 0). A vLLM worker's "
             "opt-in endpoint has no tiers and is not an engine.",
             "short",
             [Query("count by (model) "
                    f"({sum_by(_BY, series('kvobs_tier_capacity_blocks', ENGINE_PROCESS))})",
                    "{{model}}")]),
        stat("Fleet capacity per tier",
             "Bytes of KV data all selected instances can hold, per tier.",
             "bytes",
             [Query(sum_by("tier", series("kvobs_tier_capacity_bytes")), "{{tier}}")]),
        stat("Fleet hit ratio per model",
             "Share of looked-up tokens served from any tier (not recomputed), per model.",
             "percentunit",
             [Query(ratio(sum_by("model", rate("kvobs_lookup_tokens_total", 'outcome!="miss"')),
                          sum_by("model", tokens)), "{{model}}")]),
        stat("Fleet transfer bandwidth",
             "Bytes per second moved between tiers by all selected instances, per direction.",
             "Bps",
             [Query(sum_by("src_tier, dst_tier", rate("kvobs_transfer_bytes_total")),
                    "{{src_tier}} → {{dst_tier}}")]),
    ])


def _per_instance() -> Section:
    tokens = rate("kvobs_lookup_tokens_total")

    def occupancy(tier: str) -> str:
        return ratio(sum_by(_BY, series("kvobs_tier_resident_blocks", f'tier="{tier}"')),
                     sum_by(_BY, series("kvobs_tier_capacity_blocks", f'tier="{tier}"')))

    return Section("Per instance", [
        timeseries("Hit ratio per instance",
                   "Share of looked-up tokens served from any tier, per replica. Replicas of "
                   "one model behind a prefix-aware router should sit close together.",
                   "percentunit",
                   [Query(ratio(sum_by(_BY, rate("kvobs_lookup_tokens_total",
                                                 'outcome!="miss"')),
                                sum_by(_BY, tokens)), _LEGEND)],
                   ratio=True),
        timeseries("Host hit share per instance",
                   "Share of looked-up tokens served from the host tier (each one needed an "
                   "onload), per replica.",
                   "percentunit",
                   [Query(ratio(sum_by(_BY, rate("kvobs_lookup_tokens_total",
                                                 'outcome="host_hit"')),
                                sum_by(_BY, tokens)), _LEGEND)],
                   ratio=True),
        timeseries("GPU tier occupancy per instance",
                   "Share of GPU tier blocks holding KV data (in use or cached), per replica.",
                   "percentunit", [Query(occupancy("gpu"), _LEGEND)], ratio=True),
        timeseries("Host tier occupancy per instance",
                   "Share of host tier blocks holding KV data, per replica.",
                   "percentunit", [Query(occupancy("host"), _LEGEND)], ratio=True),
        timeseries("Transfer bandwidth per instance",
                   "Bytes per second moved between tiers (all directions), per replica.",
                   "Bps",
                   [Query(sum_by(_BY, rate("kvobs_transfer_bytes_total")), _LEGEND)]),
        timeseries("Onload latency p99 per instance",
                   "p99 duration of host → gpu transfer batches, per replica. One replica far "
                   "above the rest points at its host (NUMA placement, PCIe link, contention).",
                   "s",
                   [Query(quantile(0.99, "kvobs_transfer_duration_seconds", _BY,
                                   'src_tier="host"', 'dst_tier="gpu"'), _LEGEND)]),
        timeseries("Thrash onloads per instance",
                   "Blocks per second onloaded back soon after their offload, per replica.",
                   "short",
                   [Query(sum_by(_BY, rate("kvobs_thrash_onloads_total")), _LEGEND)],
                   axis_label="blocks/s"),
        timeseries("Drops and failures per instance",
                   "Blocks per second dropped (target tier full) or failed in transfers, per "
                   "replica. Failures should be zero everywhere.",
                   "short",
                   [Query(sum_by(_BY, rate("kvobs_transfer_drops_total")), "dropped " + _LEGEND),
                    Query(sum_by(_BY, rate("kvobs_transfer_failures_total")),
                          "failed " + _LEGEND)],
                   axis_label="blocks/s"),
    ])


def dashboard() -> Dashboard:
    """The *Fleet* dashboard as a grafanalib object."""
    return kvobs_dashboard(
        title=TITLE,
        uid=UID,
        description="Key KV cache tier figures per engine instance and model, for many "
                    "replicas.",
        tags=["fleet"],
        refresh="1m",
        time_from="now-3h",
        sections=[_overview(), _per_instance()],
    )
