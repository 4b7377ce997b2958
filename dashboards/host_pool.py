"""The *Host pool health* dashboard: does the host DRAM tier pay for itself?

The host pool costs PCIe bandwidth (offloads) and onload latency; it pays back when
offloaded blocks come back as host hits instead of being recomputed. This dashboard puts
both sides next to each other.

Example:
    >>> dashboard().uid
    'kvobs-host-pool'
"""

from __future__ import annotations

from grafanalib.core import Dashboard

from .curve import Marker, xy_curve
from .panels import Query, Section, heatmap, kvobs_dashboard, stat, timeseries
from .queries import quantile, rate, ratio, series, sum_by
from .recording_rules import ENGINE_PROCESS, PROCESS

UID = "kvobs-host-pool"
TITLE = "kvobs / Host pool health"
_HOST = 'tier="host"'
_ONLOAD = ('src_tier="host"', 'dst_tier="gpu"')
_OFFLOAD = ('src_tier="gpu"', 'dst_tier="host"')


def _whatif_curve() -> str:
    """The reuse_hit_ratio recording rule's formula over the dashboard's filters."""
    sampled = "kvobs_reuse_sampled_references_total"
    expected = (f"sum(rate({series('kvobs_reuse_references_total')}[1h])) "
                f"* scalar(max({series('kvobs_reuse_sample_rate')}))")
    hits = sum_by("le", rate(sampled, 'le!="+Inf"', window="1h"))
    every = sum_by("", rate(sampled, 'le="+Inf"', window="1h"))
    return (f"clamp(\n  ({hits} + ignoring (le) group_left () ({expected} - {every}))\n"
            f"  / ignoring (le) group_left () ({expected} > 0),\n  0, 1)")


#: Seconds of prefill (or onload) per second: what a host pool saves or costs per second.
PER_SECOND = "s/s"


#: When the saving panels have no value, and what to do about it.
COST_UNKNOWN = ("while the prefill cost is unknown (kvobs_prefill_cost_info source none): set "
                "KVOBS_PREFILL_SECONDS_PER_TOKEN, or wait for the measured cost. The host "
                "hits of that time are credited at the first cost once one is known (a step "
                "in the saved seconds).")


def _where_known(expr: str) -> str:
    """``expr`` (a rate per process) where that process's prefill cost is known."""
    known = series("kvobs_prefill_cost_info", 'source!="none"')
    return f"{expr}\n  and on ({PROCESS}) ({known} > 0)"


def _saved() -> str:
    """Prefill seconds per second the host hits save, over the processes whose prefill
    cost is known: no value while none is (a gap, not 0 s saved; the counter stays at 0
    until a cost credits the hits held meanwhile, :mod:`kvobs.benefit`)."""
    return sum_by("", _where_known(rate("kvobs_prefill_saved_seconds_total", _HOST)))


def _net_benefit(saved: str) -> str:
    """The net benefit rule's formula over the dashboard's filters, summed over the
    processes whose prefill cost is known (their saving against their onloads): no
    value where the prefill cost (``saved`` has none then) or the onload seconds are
    unknown (see recording_rules)."""
    seconds = sum_by("", _where_known(rate("kvobs_transfer_seconds_total", *_ONLOAD)))
    blocks = sum_by("", _where_known(rate("kvobs_transfer_blocks_total", *_ONLOAD)))
    onload = f"(({seconds}) > 0 or ({seconds}) and (({blocks}) == 0))"
    return f"{saved}\n- {onload}"


def _verdict() -> Section:
    saved = _saved()
    onload = sum_by("", rate("kvobs_transfer_seconds_total", *_ONLOAD))
    wasted = sum_by("", rate("kvobs_offloaded_evicted_unused_blocks_total"))
    offloaded = sum_by("", rate("kvobs_transfer_blocks_total", *_OFFLOAD))
    gpu_size = sum_by("", series("kvobs_tier_capacity_blocks", 'tier="gpu"'))
    cache_size = f"max({series('kvobs_reuse_capacity_blocks')})"
    return Section("Host pool verdict", [
        stat("Net benefit",
             "The verdict: the host pool saves 'saves' seconds of prefill per second (its "
             "hits' tokens x the prefill cost per token) for 'onload' seconds of onload per "
             "second (the onloads' device time); 'net' is the difference, over the "
             "processes whose prefill cost is known. Below zero the "
             "host pool adds latency (alert KvobsHostPoolCostsMoreThanItSaves). 'net' has "
             "no value where the engine does not time its onloads; 'saves' and 'net' none "
             + COST_UNKNOWN,
             PER_SECOND,
             [Query(saved, "saves"), Query(onload, "onload"), Query(_net_benefit(saved), "net")]),
        timeseries("Prefill saved vs onload time",
                   "Seconds per second. Saved: host-hit tokens x prefill cost per token "
                   "(kvobs_prefill_cost_info says whether the cost is measured, modelled or "
                   "configured). Onload: device seconds of host → gpu transfers, each "
                   "transfer once (tensor-parallel shards: their mean). No 'prefill saved' "
                   "line " + COST_UNKNOWN,
                   PER_SECOND,
                   [Query(saved, "prefill saved"), Query(onload, "onload")],
                   axis_label="seconds per second"),
        xy_curve("What-if: hit ratio by cache size",
                 "Predicted LRU hit ratio of block references if the whole cache held "
                 "that many blocks (GPU blocks; x axis in powers of two), from the sampled "
                 "reuse-distance profile over the last hour: one curve, sizes in numeric "
                 "order. The vertical lines mark the engine's sizes: GPU (dashed, "
                 "kvobs_tier_capacity_blocks) and all tiers (dotted, "
                 "kvobs_reuse_capacity_blocks, the 1x point): the distinct blocks the tiers "
                 "hold, the largest tier's where they keep copies of each other (vLLM, "
                 "SGLang, LMCache), their sum where a block lives in one tier at a time (the "
                 "reference pool). The stat 'Cache sizes' beside it gives their numbers. "
                 "`kvobs whatif --prometheus` answers for any size and in GiB.",
                 "percentunit", Query(_whatif_curve(), "hit ratio"), "le",
                 "cache size (blocks)",
                 [Marker(Query(gpu_size, "GPU"), "GPU", "gpu", "dash"),
                  Marker(Query(cache_size, "all tiers"), "all tiers", "host", "dot")],
                 width=9),
        stat("Cache sizes",
             "The engine's cache sizes in GPU blocks, as marked on the what-if curve: the "
             "GPU pool, and the distinct blocks all tiers hold (the size the reuse "
             "profile's buckets are multiples of).",
             "short",
             [Query(gpu_size, "GPU"), Query(cache_size, "all tiers")], width=3),
        stat("Wasted offloads",
             "Share of offloaded blocks evicted from the host before any reuse: PCIe "
             "bandwidth spent for nothing.",
             "percentunit",
             [Query(ratio(wasted, offloaded), "wasted")]),
    ])


def _occupancy() -> Section:
    return Section("Occupancy and evictions", [
        timeseries("Host occupancy",
                   "Share of the host tier's blocks holding KV data, cached (reusable by a "
                   "later host hit) or in use (pinned by a running transfer). A host tier at "
                   "100% evicts on every offload.",
                   "percentunit",
                   [Query(ratio(sum_by("tier, state",
                                       series("kvobs_tier_resident_blocks", _HOST, state)),
                                sum_by("tier", series("kvobs_tier_capacity_blocks", _HOST)),
                                "on (tier) group_left ()"), "{{tier}} {{state}}")
                    for state in ('state="in_use"', 'state="cached"')],
                   ratio=True, stack_per_tier=True),
        timeseries("Host evictions by reason",
                   "Blocks per second dropped from the host tier, stacked by reason in shades "
                   "of the host colour (as on the tiers dashboard). Capacity "
                   "evictions at the offload rate mean the host tier turns over completely.",
                   "short",
                   [Query(sum_by("tier, reason", rate("kvobs_block_evictions_total", _HOST)),
                          "{{tier}} {{reason}}")],
                   axis_label="blocks/s", stacked=True),
    ])


def _payoff() -> Section:
    reused = sum_by("", rate("kvobs_offloaded_reused_blocks_total"))
    wasted = sum_by("", rate("kvobs_offloaded_evicted_unused_blocks_total"))
    return Section("Does offloading pay off", [
        timeseries("Offloaded blocks: reused vs evicted unused",
                   "Blocks per second: offloaded blocks onloaded at least once (reused) and "
                   "offloaded blocks evicted before any reuse (wasted offload bandwidth).",
                   "short",
                   [Query(reused, "reused"), Query(wasted, "evicted unused")],
                   axis_label="blocks/s"),
        timeseries("Offload payoff ratio",
                   "Reused / (reused + evicted unused): the share of offloads that came back "
                   "as host hits. Near 0 the host tier costs PCIe bandwidth for nothing; "
                   "raise its size or stop offloading short-lived prefixes.",
                   "percentunit",
                   [Query(ratio(reused, f"{reused} + {wasted}"), "payoff")],
                   ratio=True),
        timeseries("Re-onload (thrash) rate",
                   "Blocks per second onloaded back to the GPU within the thrash window after "
                   "their offload. Their share of all onloads is the next panel.",
                   "short",
                   [Query(sum_by("", rate("kvobs_thrash_onloads_total")), "thrash onloads")],
                   axis_label="blocks/s"),
        timeseries("Thrash share of onloads",
                   "Share of onloaded blocks that came back within the thrash window of their "
                   "offload (0-1). A high share means the GPU tier is too small for the "
                   "working set: blocks bounce over PCIe (alert KvobsHostPoolThrashing).",
                   "percentunit",
                   [Query(ratio(sum_by("", rate("kvobs_thrash_onloads_total")),
                                sum_by("", rate("kvobs_transfer_blocks_total", *_ONLOAD))),
                          "share of onloads")],
                   ratio=True),
    ])


def _onloads() -> Section:
    # an engine's tokens once (each tensor-parallel rank sees the batch), its bytes from
    # every rank (each moves its shard)
    host_hit_tokens = sum_by("", rate("kvobs_lookup_tokens_total", 'outcome="host_hit"',
                                      ENGINE_PROCESS))
    return Section("Onloads", [
        timeseries("Onload latency p50 / p99",
                   "Duration of one host → gpu transfer batch. Every host hit waits for its "
                   "onload before prefill can skip those tokens; compare with the prefill time "
                   "the hit saves.",
                   "s",
                   [Query(quantile(0.5, "kvobs_transfer_duration_seconds", "src_tier, dst_tier",
                                   *_ONLOAD), "p50"),
                    Query(quantile(0.99, "kvobs_transfer_duration_seconds", "src_tier, dst_tier",
                                   *_ONLOAD), "p99")]),
        heatmap("Onload latency heatmap",
                "host → gpu transfer batches per second by duration bucket.",
                "s",
                Query(sum_by("le", rate("kvobs_transfer_duration_seconds_bucket", *_ONLOAD)),
                      "{{le}}")),
        timeseries("Onload bytes per host hit token",
                   "Bytes onloaded per prompt token served from the host tier. It should sit "
                   "near the model's KV bytes per token; far above it means blocks are onloaded "
                   "that lookups never use.",
                   "bytes",
                   [Query(ratio(sum_by("", rate("kvobs_transfer_bytes_total", *_ONLOAD)),
                                host_hit_tokens), "bytes per host-hit token")]),
        timeseries("Offload and onload bandwidth",
                   "Bytes per second offloaded (gpu → host) and onloaded (host → gpu).",
                   "Bps",
                   [Query(sum_by("", rate("kvobs_transfer_bytes_total", *_OFFLOAD)), "offload"),
                    Query(sum_by("", rate("kvobs_transfer_bytes_total", *_ONLOAD)), "onload")]),
    ])


def dashboard() -> Dashboard:
    """The *Host pool health* dashboard as a grafanalib object."""
    return kvobs_dashboard(
        title=TITLE,
        uid=UID,
        description="Host DRAM tier: occupancy, evictions, offload payoff, thrash and onload "
                    "cost of kvobs-instrumented inference engines.",
        tags=["host-pool"],
        refresh="30s",
        time_from="now-1h",
        sections=[_verdict(), _occupancy(), _payoff(), _onloads()],
    )
