"""The *KV cache tiers* dashboard: capacity, occupancy, hits, transfers and thrash per tier.

Read it top to bottom: how big each tier is, how full it is, where lookups were served,
what moving blocks between tiers costs, and whether blocks bounce between tiers.

Example:
    >>> board = dashboard()
    >>> board.uid, board.title
    ('kvobs-tiers', 'kvobs / KV cache tiers')
"""

from __future__ import annotations

from grafanalib.core import Dashboard

from kvobs.misses import CAUSE_LEGEND, RECOVERABLE_LEGEND

from .panels import Query, Section, heatmap, kvobs_dashboard, stat, timeseries
from .queries import quantile, rate, ratio, series, sum_by
from .recording_rules import ENGINE_PROCESS

UID = "kvobs-tiers"
TITLE = "kvobs / KV cache tiers"
_LINK = "{{src_tier}} → {{dst_tier}}"
#: The per-tier panels repeat over the ``tier`` variable: one copy per selected tier.
_TIER = 'tier=~"$tier"'
#: Resident states in stacking order: in use at the bottom, cached on top of it.
_STATES = ('state="in_use"', 'state="cached"')


def _capacity() -> Section:
    return Section("Capacity and occupancy", [
        stat("Capacity per tier (tokens)",
             "Tokens of KV data each tier can hold, summed over the selected instances. The "
             "GPU tier bounds how many requests run at once; the host tier bounds how much "
             "reusable context is kept. They are never added into one concurrency figure.",
             "short", [Query(sum_by("tier", series("kvobs_tier_capacity_tokens")), "{{tier}}")],
             width=12),
        stat("Capacity per tier (bytes)",
             "Bytes of KV data each tier can hold (blocks x bytes per block), summed over "
             "the selected instances.",
             "bytes", [Query(sum_by("tier", series("kvobs_tier_capacity_bytes")), "{{tier}}")],
             width=12),
        timeseries("Resident occupancy of $tier (in use vs cached)",
                   "Share of each tier's blocks that hold KV data, stacked per tier in its colour: "
                   "in_use (full shade) by running requests, cached (light shade) for reuse by "
                   "a later prefix hit; the top of a tier's stack is its occupancy, the rest "
                   "is free. A tier near "
                   "100% with mostly cached blocks is full of reusable context (good); near "
                   "100% in_use means it limits the batch.",
                   "percentunit",
                   [Query(ratio(sum_by("tier, state",
                                       series("kvobs_tier_resident_blocks", _TIER, state)),
                                sum_by("tier", series("kvobs_tier_capacity_blocks", _TIER)),
                                "on (tier) group_left ()"),
                          "{{tier}} {{state}}") for state in _STATES],
                   ratio=True, stack_per_tier=True, repeat="tier", width=24),
        timeseries("Resident bytes of $tier",
                   "Bytes of KV data resident per tier, in_use and cached stacked per tier, with "
                   "each tier's capacity as a dashed reference line in its colour. Resident "
                   "never exceeds capacity.",
                   "bytes",
                   [*(Query(sum_by("tier, state",
                                   series("kvobs_tier_resident_bytes", _TIER, state)),
                            "{{tier}} {{state}}") for state in _STATES),
                    Query(sum_by("tier", series("kvobs_tier_capacity_bytes", _TIER)),
                          "{{tier}} capacity")],
                   stack_per_tier=True, repeat="tier", width=24),
    ])


def _lookups() -> Section:
    # an engine's lookups once: tensor-parallel ranks of one engine (SGLang, LMCache) each
    # see the whole batch
    tokens = rate("kvobs_lookup_tokens_total", ENGINE_PROCESS)
    looked_up = sum_by("", rate("kvobs_lookup_tokens_total", ENGINE_PROCESS, window="$__range"))
    return Section("Where lookups were served", [
        timeseries("Lookup tokens by outcome",
                   "Prompt tokens per second by where their KV data was found: gpu_hit (free), "
                   "host_hit (needs an onload over PCIe), disk_hit, miss (needs recompute). "
                   "The stack height is all looked-up tokens.",
                   "short", [Query(sum_by("outcome", tokens), "{{outcome}}")],
                   axis_label="tokens/s", stacked=True),
        timeseries("Hit ratio per tier",
                   "Fraction of looked-up tokens served by each tier; 1 minus their sum is the "
                   "miss ratio. A high host_hit share means the host pool saves prefill work.",
                   "percentunit",
                   [Query(ratio(sum_by("outcome", rate("kvobs_lookup_tokens_total",
                                                       'outcome=~".+_hit"', ENGINE_PROCESS)),
                                sum_by("", tokens), "ignoring (outcome) group_left ()"),
                          "{{outcome}}")],
                   ratio=True),
        timeseries("Why lookups missed: tokens by hit tier and miss cause",
                   "Looked-up prompt tokens per second, walked from hits to each miss cause: "
                   "gpu_hit, host_hit and disk_hit, then the missed ones by why they missed "
                   "(kvobs_miss_tokens_total): cold (never seen: no cache size helps), evicted "
                   "(seen farther back than the tiers hold: more capacity wins them back, the "
                   "what-if curve says how much), dropped (held within the capacity, its "
                   "offload refused by a full tier), in_flight (its offload still being "
                   "written), other (held within the capacity, missed anyway: the engine's "
                   "eviction policy), not_cacheable (partial blocks, the prompt's last token) "
                   "and unknown "
                   "(looked up without block keys). The stack height is all looked-up tokens.",
                   "short",
                   [Query(sum_by("outcome", rate("kvobs_lookup_tokens_total",
                                                 'outcome=~".+_hit"', ENGINE_PROCESS)),
                          "{{outcome}}"),
                    Query(sum_by("cause", rate("kvobs_miss_tokens_total", ENGINE_PROCESS)),
                          "miss: {{cause}}")],
                   axis_label="tokens/s", stacked=True, width=16),
        stat("Looked-up tokens over the window: hits, then miss causes",
             "The prompt tokens looked up over the dashboard's time range, walked in order "
             "(a ratio of rates over the range: of increases alike): the share each tier "
             "hit, then each miss cause's share; and the share an LRU cache of twice the "
             "tiers' capacity would have hit of the evicted ones (what doubling the "
             "capacity wins back).",
             "percentunit",
             [Query(ratio(sum_by("outcome", rate("kvobs_lookup_tokens_total",
                                                 'outcome=~".+_hit"', ENGINE_PROCESS,
                                                 window="$__range")),
                          looked_up, "ignoring (outcome) group_left ()"), "{{outcome}}"),
              Query(ratio(sum_by("cause", rate("kvobs_miss_tokens_total", ENGINE_PROCESS,
                                               window="$__range")),
                          looked_up, "ignoring (cause) group_left ()"),
                    CAUSE_LEGEND),
              Query(ratio(sum_by("", rate("kvobs_miss_recoverable_tokens_total", ENGINE_PROCESS,
                                          window="$__range")), looked_up),
                    RECOVERABLE_LEGEND)],
             width=8),
        timeseries("Lookups per second",
                   "Prefix-cache lookups per second, one per admitted request. Together with "
                   "'Lookup tokens by outcome' it gives the prompt tokens per request.",
                   "short", [Query(sum_by("", rate("kvobs_lookups_total", ENGINE_PROCESS)),
                                    "lookups/s")],
                   axis_label="lookups/s"),
    ])


def _transfers() -> Section:
    return Section("Transfers between tiers", [
        timeseries("Transfer throughput per direction vs link peak",
                   "Bytes per second moved between tiers, per direction (gpu → host are "
                   "offloads, host → gpu onloads). The dashed reference is the PCIe peak per "
                   "direction read from NVML; it is absent where no GPU is visible.",
                   "Bps",
                   [Query(sum_by("src_tier, dst_tier", rate("kvobs_transfer_bytes_total")),
                          _LINK),
                    Query(f"max({series('kvobs_pcie_peak_bandwidth_bytes_per_second')})",
                          "PCIe peak per direction")]),
        timeseries("Transfer latency p50 / p99",
                   "Duration of one transfer batch, timed on the device stream where there is "
                   "one. p99 far above p50 means queueing behind other copies or compute.",
                   "s",
                   [Query(quantile(0.5, "kvobs_transfer_duration_seconds", "src_tier, dst_tier"),
                          "p50 " + _LINK),
                    Query(quantile(0.99, "kvobs_transfer_duration_seconds",
                                   "src_tier, dst_tier"), "p99 " + _LINK)]),
        heatmap("Transfer latency heatmap",
                "Transfer batches per second by duration bucket, all directions. A second "
                "band well above the main one points at contention.",
                "s",
                Query(sum_by("le", rate("kvobs_transfer_duration_seconds_bucket")), "{{le}}")),
        timeseries("Drops and failures",
                   "Blocks per second not offloaded because the target tier was full (drops) "
                   "and blocks whose transfer failed. Failures should stay at zero; sustained "
                   "drops mean the host tier is too small for the offload rate.",
                   "short",
                   [Query(sum_by("src_tier, dst_tier", rate("kvobs_transfer_drops_total")),
                          "dropped " + _LINK),
                    Query(sum_by("src_tier, dst_tier", rate("kvobs_transfer_failures_total")),
                          "failed " + _LINK)],
                   axis_label="blocks/s"),
    ])


def _thrash() -> Section:
    return Section("Thrash and evictions", [
        timeseries("Thrash signals",
                   "Blocks per second onloaded back within the thrash window after being "
                   "offloaded (the GPU tier is too small for the working set), offloaded blocks "
                   "reused at least once (the host pool paid off) and offloaded blocks evicted "
                   "before any reuse (wasted PCIe bandwidth).",
                   "short",
                   [Query(sum_by("", rate("kvobs_thrash_onloads_total")), "thrash onloads"),
                    Query(sum_by("", rate("kvobs_offloaded_reused_blocks_total")),
                          "offloaded, reused"),
                    Query(sum_by("", rate("kvobs_offloaded_evicted_unused_blocks_total")),
                          "offloaded, evicted unused")],
                   axis_label="blocks/s"),
        timeseries("Evictions per tier and reason",
                   "Cached blocks dropped per second, by tier and reason: the colour is the tier, "
                   "the reason a shade and dash of it (capacity solid, explicit dashed, reset "
                   "dotted, other dash-dotted). Sustained capacity evictions on a full tier "
                   "mean reusable context is being thrown away.",
                   "short",
                   [Query(sum_by("tier, reason", rate("kvobs_block_evictions_total")),
                          "{{tier}} {{reason}}")],
                   axis_label="blocks/s"),
    ])


def dashboard() -> Dashboard:
    """The *KV cache tiers* dashboard as a grafanalib object."""
    return kvobs_dashboard(
        title=TITLE,
        uid=UID,
        description="Per-tier capacity, occupancy, hits, transfers and thrash of kvobs-"
                    "instrumented inference engines.",
        tags=[],
        refresh="30s",
        time_from="now-1h",
        sections=[_capacity(), _lookups(), _transfers(), _thrash()],
    )
