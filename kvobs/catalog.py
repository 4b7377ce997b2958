"""The metric catalog: every series kvobs exports, in one table.

Exporters, the README table, dashboards and alert rules all read this table, so a
metric is added, renamed or documented in exactly one place. Names are the final
Prometheus names (base units, ``_total`` on counters); the OpenTelemetry instrument name
is derived from them (see :attr:`MetricSpec.otel_name`) so that the OpenTelemetry
Prometheus exporter produces exactly ``name`` again.

Every series also carries :data:`COMMON_LABELS` (engine, model). Label values are
bounded: tier names, transfer directions, lookup outcomes, eviction reasons,
instrumentation component names and GPU indices. Block and request ids go to logs.

Example:
    >>> spec = by_name("kvobs_lookup_tokens_total")
    >>> spec.kind, spec.labels, spec.otel_name
    ('counter', ('outcome',), 'kvobs_lookup_tokens')
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

MetricKind = Literal["counter", "gauge", "histogram"]

COMMON_LABELS: tuple[str, ...] = ("engine", "model")

#: Lookup outcomes, fastest first; ``miss`` means the tokens must be recomputed.
LOOKUP_OUTCOMES: tuple[str, ...] = ("gpu_hit", "host_hit", "disk_hit", "miss")

#: Why a block left a tier. ``capacity``: pushed out to make room; ``explicit``: the
#: engine removed it; ``reset``: the whole cache was cleared; ``other``: anything else.
EVICTION_REASONS: tuple[str, ...] = ("capacity", "explicit", "reset", "other")

RESIDENT_STATES: tuple[str, ...] = ("in_use", "cached")

#: Transfer duration histogram buckets in seconds: 10 us to 10 s.
DURATION_BUCKETS_S: tuple[float, ...] = (
    1e-5,
    2.5e-5,
    5e-5,
    1e-4,
    2.5e-4,
    5e-4,
    1e-3,
    2.5e-3,
    5e-3,
    1e-2,
    2.5e-2,
    5e-2,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)

#: Residency and reuse-gap histogram buckets in seconds: 100 ms to a day.
RESIDENCY_BUCKETS_S: tuple[float, ...] = (
    0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0, 21600.0,
    86400.0,
)

#: Prefill cost sources (see kvobs.benefit).
PREFILL_COST_SOURCES: tuple[str, ...] = ("none", "configured", "modelled", "measured")

_UNIT_SUFFIXES = {"s": "_seconds", "By": "_bytes"}


@dataclass(frozen=True)
class MetricSpec:
    """One exported metric.

    Attributes:
        name: final Prometheus name.
        kind: counter, gauge or histogram.
        unit: UCUM unit as OpenTelemetry spells it (``By``, ``s``, ``{block}``...).
        labels: metric-specific label names, in addition to :data:`COMMON_LABELS`.
        help: one sentence saying what it counts and how to read it.
    """

    name: str
    kind: MetricKind
    unit: str
    labels: tuple[str, ...]
    help: str

    @property
    def otel_name(self) -> str:
        """OpenTelemetry instrument name that the Prometheus exporter maps back to ``name``."""
        base = self.name.removesuffix("_total") if self.kind == "counter" else self.name
        suffix = _UNIT_SUFFIXES.get(self.unit, "")
        if self.unit == "s" and suffix and base.endswith(suffix):
            base = base.removesuffix(suffix)
        return base

    @property
    def all_labels(self) -> tuple[str, ...]:
        """Every label a series of this metric carries."""
        return COMMON_LABELS + self.labels


def _c(name: str, unit: str, labels: tuple[str, ...], help: str) -> MetricSpec:
    return MetricSpec(name, "counter", unit, labels, help)


def _g(name: str, unit: str, labels: tuple[str, ...], help: str) -> MetricSpec:
    return MetricSpec(name, "gauge", unit, labels, help)


_T = ("tier",)
_LINK = ("src_tier", "dst_tier")

METRICS: tuple[MetricSpec, ...] = (
    _g("kvobs_tier_capacity_blocks", "{block}", _T, "Blocks the tier can hold."),
    _g("kvobs_tier_capacity_tokens", "{token}", _T, "Tokens of KV data the tier can hold."),
    _g("kvobs_tier_capacity_bytes", "By", _T, "Bytes of KV data the tier can hold."),
    _g(
        "kvobs_tier_resident_blocks",
        "{block}",
        ("tier", "state"),
        "Blocks holding KV data: in_use by running requests, or cached for reuse. "
        "Capacity minus both is free.",
    ),
    _g(
        "kvobs_tier_resident_bytes",
        "By",
        ("tier", "state"),
        "Bytes of KV data resident in the tier, by state (in_use or cached).",
    ),
    _c(
        "kvobs_block_allocations_total",
        "{block}",
        _T,
        "Blocks handed to requests from the free list.",
    ),
    _c(
        "kvobs_block_frees_total",
        "{block}",
        _T,
        "Blocks released by requests (to the cache or to the free list).",
    ),
    _c(
        "kvobs_block_reuses_total",
        "{block}",
        _T,
        "Cached blocks taken back into use by a prefix hit.",
    ),
    _c(
        "kvobs_block_stores_total",
        "{block}",
        _T,
        "Blocks written into the tier as cached data (offloads landing in it).",
    ),
    _c(
        "kvobs_block_evictions_total",
        "{block}",
        ("tier", "reason"),
        "Cached blocks dropped from the tier, by reason.",
    ),
    _c("kvobs_lookups_total", "{lookup}", (), "Prefix-cache lookups (one per request admission)."),
    _c(
        "kvobs_lookup_tokens_total",
        "{token}",
        ("outcome",),
        "Prompt tokens looked up, by where they were found: gpu_hit, host_hit (needs an "
        "onload), disk_hit, or miss (needs recompute). The outcomes sum to all looked-up tokens.",
    ),
    _c(
        "kvobs_miss_tokens_total",
        "{token}",
        ("cause",),
        "Missed prompt tokens (outcome=\"miss\"), by why they missed: cold (first seen "
        "within the reuse profile's horizon, 16x the tiers' capacity), evicted (seen before, "
        "farther back than the capacity: more capacity wins it back), dropped (within the "
        "capacity, its offload refused by a full tier), in_flight (within the capacity, its "
        "offload still being written), other (within the capacity, missed anyway: a policy "
        "other than LRU), not_cacheable (no whole block the engine could hit: a partial last "
        "block), unknown (looked up without block keys). The causes sum to the missed "
        "tokens; cold and evicted are exact while the profile tracks every block, and "
        "apportioned by the sampled blocks' split beyond that.",
    ),
    _c("kvobs_miss_recoverable_tokens_total", "{token}", (),
       "Of the evicted missed tokens (kvobs_miss_tokens_total{cause=\"evicted\"}), those an "
       "LRU cache of twice the tiers' capacity would have hit: what doubling the capacity "
       "wins back, in tokens (exact for the blocks the reuse profile tracks; a sampled-out "
       "block is never counted here)."),
    _c("kvobs_preempted_lookups_total", "{lookup}", (),
       "Prefix-cache lookups of preempted requests at their re-admission (vLLM), left out of "
       "kvobs_lookups_total as vLLM's prefix-cache hit rate leaves them out."),
    _c(
        "kvobs_preempted_lookup_tokens_total",
        "{token}",
        ("outcome",),
        "Prompt tokens of those re-lookups, by where they were found (the outcomes of "
        "kvobs_lookup_tokens_total). Their host and disk hits spare a recompute: they count "
        "in kvobs_prefill_saved_seconds_total.",
    ),
    _c(
        "kvobs_transfer_operations_total",
        "{operation}",
        _LINK,
        "Completed block transfers (batches) between tiers.",
    ),
    _c("kvobs_transfer_blocks_total", "{block}", _LINK, "Blocks moved between tiers."),
    _c("kvobs_transfer_bytes_total", "By", _LINK, "Bytes moved between tiers."),
    _c("kvobs_transfer_failures_total", "{block}", _LINK, "Blocks whose transfer failed."),
    _c(
        "kvobs_transfer_drops_total",
        "{block}",
        _LINK,
        "Blocks not transferred because the destination tier was full.",
    ),
    MetricSpec(
        "kvobs_transfer_duration_seconds",
        "histogram",
        "s",
        _LINK,
        "Duration of one transfer batch, timed on the device stream where there is one.",
    ),
    MetricSpec(
        "kvobs_transfer_shard_duration_seconds",
        "histogram",
        "s",
        _LINK,
        "Device time of one worker's shard of a transfer (a vLLM worker's own endpoint, "
        "KVOBS_WORKER_METRICS=1); the engine's endpoint counts the transfer itself.",
    ),
    _c(
        "kvobs_transfer_seconds_total",
        "s",
        _LINK,
        "Seconds transfers between tiers took, each transfer counted once, timed on the "
        "device where there is one. A transfer split into shards across tensor-parallel "
        "workers counts the mean of its shards' times (vLLM: its reported time over its "
        "workers).",
    ),
    _c(
        "kvobs_thrash_onloads_total",
        "{block}",
        (),
        "Blocks onloaded back to the GPU within the thrash window after being offloaded.",
    ),
    _c(
        "kvobs_offloaded_reused_blocks_total",
        "{block}",
        (),
        "Offloaded blocks that were onloaded at least once (the host pool paid off).",
    ),
    _c(
        "kvobs_offloaded_evicted_unused_blocks_total",
        "{block}",
        (),
        "Offloaded blocks evicted from the host tier before any reuse (wasted offloads).",
    ),
    _c(
        "kvobs_thrash_untracked_blocks_total",
        "{block}",
        (),
        "Offloaded blocks the thrash tracker forgot (it keeps the newest 2^18): their later "
        "onloads and evictions are not counted as thrash, reuse or waste.",
    ),
    _c(
        "kvobs_prefill_saved_seconds_total",
        "s",
        _T,
        "Prefill compute seconds saved by hits in a slower tier (host, disk), re-lookups of "
        "preempted requests included: hit tokens x the prefill cost per token; hits met "
        "while no cost was known are credited at the first one, in one step. Compare with "
        "the onload transfers' seconds.",
    ),
    _g(
        "kvobs_prefill_cost_seconds",
        "s",
        (),
        "Prefill compute seconds per prompt token used for the saved seconds; absent while "
        "none is known (kvobs_prefill_cost_info source none).",
    ),
    _g(
        "kvobs_prefill_cost_info",
        "1",
        ("source",),
        "Where the prefill cost per token comes from (value 1): measured (fit of engine "
        "step times), modelled (a simulation), configured, or none (hits are held and "
        "counted as saved once a cost is known: set KVOBS_PREFILL_SECONDS_PER_TOKEN, or "
        "wait for the measured one).",
    ),
    _g(
        "kvobs_prefill_cost_relative_error",
        "1",
        (),
        "Relative standard error of the measured prefill cost fit (present once a fit "
        "was made; from the noisier of all steps and the steps with prefill, at Student's "
        "t for few of them). Above 0.1 the fit is not used: the cost falls back to "
        "configured or none.",
    ),
    _c(
        "kvobs_reuse_references_total",
        "{reference}",
        (),
        "Block references at the prefix lookup (every block of every looked-up prompt).",
    ),
    _c(
        "kvobs_reuse_sampled_references_total",
        "{reference}",
        ("le",),
        "Block references whose LRU reuse distance is at most le blocks, in samples at "
        "kvobs_reuse_sample_rate: a reference counts the rate (a fraction of a sample) "
        "where its distance is exact (within kvobs_reuse_exact_blocks, or every block "
        "tracked), a sampled one beyond that the references it stands for "
        '(cumulative; le="+Inf" counts every reference, cold ones included). '
        "The kvobs:reuse_hit_ratio rules turn it into the predicted hit ratio per size.",
    ),
    _g(
        "kvobs_reuse_sample_rate",
        "1",
        (),
        "The reuse-distance profile's sampling rate: the unit of "
        "kvobs_reuse_sampled_references_total, and the least share of blocks it tracks (it "
        "tracks every block until its memory bound has filled, then halves the share down "
        "to this rate).",
    ),
    _g(
        "kvobs_reuse_tracking_rate",
        "1",
        (),
        "Share of blocks the reuse-distance profile's sampled stack tracks now: 1 "
        "(distances exact) until as many distinct blocks as its memory bound holds were "
        "tracked, then halved each time the bound fills again, down to "
        "kvobs_reuse_sample_rate; it never rises again.",
    ),
    _g(
        "kvobs_reuse_exact_blocks",
        "{block}",
        (),
        "Reuse distances up to this many blocks are counted exactly now, whatever "
        "kvobs_reuse_tracking_rate: the profile's exact LRU stack of the most recently used "
        "blocks (131,072 by default; 0: none, then exact only while the tracking rate is "
        "1). Every kvobs_reuse_sampled_references_total bucket up to it is exact.",
    ),
    _g(
        "kvobs_reuse_capacity_blocks",
        "{block}",
        (),
        "Configured cache size (all tiers, in lookup blocks) the reuse buckets are "
        "multiples of (1/8x to 16x).",
    ),
    _c(
        "kvobs_reuse_forgotten_blocks_total",
        "{block}",
        (),
        "Sampled blocks the reuse-distance profile forgot to stay within its memory bound "
        "(least recently used first): their next references count as beyond every bucket. "
        "With the default rate they are beyond 16x the capacity anyway; with a rate set by "
        "hand, a rising count means the larger sizes read low.",
    ),
    MetricSpec(
        "kvobs_block_residency_seconds",
        "histogram",
        "s",
        _T,
        "Time sampled blocks stayed in the tier, from arrival to eviction.",
    ),
    MetricSpec(
        "kvobs_block_reuse_gap_seconds",
        "histogram",
        "s",
        _T,
        "Time between consecutive uses of sampled blocks in the tier.",
    ),
    _c(
        "kvobs_hot_buffer_lookups_total",
        "{row}",
        ("outcome",),
        "KV rows a sparse-attention step looked for in its GPU hot buffer (vLLM HiSparse): "
        "outcome hit = already there, miss = loaded from the host tier (top-k rows, not "
        "pages; present only where the engine has hot buffers).",
    ),
    _c(
        "kvobs_hot_buffer_load_bytes_total",
        "By",
        (),
        "Bytes the hot-buffer misses loaded from the host tier into the GPU (vLLM HiSparse; "
        "row loads, not counted in the page transfers).",
    ),
    _g(
        "kvobs_engine_info",
        "1",
        ("engine_version", "support"),
        "The engine release kvobs reads (value 1), and whether kvobs was tested on it: "
        "tested, untested (not in kvobs's version matrix: read part by part), or older.",
    ),
    _g(
        "kvobs_part_enabled",
        "1",
        ("part",),
        "1 where kvobs reads this part of the engine (gpu_tier, host_tier, lookups, "
        "transfers, step_timing, ...), 0 where it turned it off: an engine whose objects "
        "changed shape, or a reader that failed (the enable log line says why). An off "
        "part's series are absent or stop.",
    ),
    _c(
        "kvobs_instrumentation_errors_total",
        "{error}",
        ("component",),
        "Failures inside kvobs instrumentation; the engine call went on unaffected.",
    ),
    _c(
        "kvobs_telemetry_dropped_samples_total",
        "{sample}",
        (),
        "Transfer duration samples dropped because the buffer was full between collections.",
    ),
    _g("kvobs_gpu_memory_total_bytes", "By", ("device",), "GPU memory size (NVML)."),
    _g("kvobs_gpu_memory_used_bytes", "By", ("device",), "GPU memory in use (NVML)."),
    _g(
        "kvobs_pcie_link_generation",
        "{generation}",
        ("device",),
        "Current PCIe link generation (NVML).",
    ),
    _g("kvobs_pcie_link_width", "{lane}", ("device",), "Current PCIe link width in lanes (NVML)."),
    _g(
        "kvobs_pcie_peak_bandwidth_bytes_per_second",
        "By/s",
        ("device",),
        "Peak PCIe bandwidth per direction from link generation and width (NVML).",
    ),
)

#: The series ``kvobs fleet`` exports (:mod:`kvobs.fleet`), from the engines' KV events.
#: They carry ``model`` (not ``engine``) beside the labels listed here; counts of blocks
#: and tokens are estimates scaled by the inverse of ``kvobs_fleet_sampling_rate``.
FLEET_LABELS: tuple[str, ...] = ("model",)
FLEET_METRICS: tuple[MetricSpec, ...] = (
    _g("kvobs_fleet_resident_blocks", "{block}", ("replica", "tier"),
       "KV blocks each replica holds in each tier, from its KV events."),
    _g("kvobs_fleet_resident_bytes", "By", ("replica", "tier"),
       "The same in bytes (--block-bytes given)."),
    _g("kvobs_fleet_distinct_blocks", "{block}", ("tier",),
       "Blocks held in the tier by at least one replica."),
    _g("kvobs_fleet_duplicated_blocks", "{block}", ("tier",),
       "Blocks held in the tier by two or more replicas."),
    _g("kvobs_fleet_duplicate_copies_blocks", "{block}", ("tier",),
       "Copies of those blocks beyond the first: the tier's capacity the fleet "
       "spends holding a block twice."),
    _c("kvobs_fleet_stored_blocks_total", "{block}", ("replica", "tier"),
       "Blocks each replica stored in each tier (BlockStored)."),
    _c("kvobs_fleet_removed_blocks_total", "{block}", ("replica", "tier"),
       "Blocks each replica removed from each tier (BlockRemoved)."),
    _c("kvobs_fleet_computed_tokens_total", "{token}", ("replica", "cause"),
       "Tokens of blocks a replica computed and stored to its GPU, by why no copy "
       "served them: routing (another replica held the block, in any tier: routing "
       "by prefix would have hit it), evicted (this replica held it before), "
       "evicted_elsewhere (only other replicas held it before), cold (no replica "
       "held it before)."),
    _c("kvobs_fleet_loaded_tokens_total", "{token}", ("replica", "tier"),
       "Tokens of blocks a replica stored to its GPU from one of its own lower "
       "tiers (host hits)."),
    _c("kvobs_fleet_reused_tokens_total", "{token}", ("replica",),
       "Tokens of blocks a replica reported reused on its GPU (vLLM's "
       "kv_cache_report_mode=full; 0 otherwise)."),
    _c("kvobs_fleet_cleared_total", "{event}", ("replica",),
       "Times a replica cleared its prefix cache (AllBlocksCleared)."),
    _c("kvobs_fleet_event_batches_total", "{event}", ("replica",),
       "Event batches read from each replica."),
    _c("kvobs_fleet_skipped_events_total", "{event}", ("replica", "reason"),
       "Events skipped: malformed_batch (a payload that is no batch), malformed "
       "(an event missing a field), unknown (an event type or medium this kvobs "
       "does not know)."),
    _c("kvobs_fleet_gaps_total", "{event}", ("replica", "outcome"),
       "Gaps in a replica's batch sequence: replayed (asked again and applied), "
       "lost (the publisher no longer held them: the replica's entries were "
       "dropped and refill from its new events)."),
    _c("kvobs_fleet_lost_batches_total", "{event}", ("replica",),
       "Batches lost in gaps."),
    _c("kvobs_fleet_restarts_total", "{event}", ("replica",),
       "Times a replica's batch sequence started again (an engine restart)."),
    _c("kvobs_fleet_errors_total", "{event}", ("replica",),
       "Errors reading a replica's events (logged at most once a minute)."),
    _g("kvobs_fleet_publisher_up", "1", ("replica",),
       "1 if the replica's replay endpoint answered the last probe, 0 if not "
       "(only where a replay endpoint is given)."),
    _g("kvobs_fleet_last_batch_timestamp_seconds", "s", ("replica",),
       "The engine's timestamp of the last batch read from the replica."),
    _c("kvobs_fleet_pooled_hit_tokens_total", "{token}", ("blocks",),
       "The pooled what-if (kvobs fleet --pooled-capacity): tokens an LRU cache of "
       "`blocks` GPU blocks shared by the whole fleet (perfect prefix routing) would have "
       "hit, over every block the replicas stored to their GPUs in arrival order; blocks "
       "is 1/8 to 16 times the pooled capacity. Exact where the engines publish their "
       "prefix hits (vLLM's kv_cache_report_mode=full)."),
    _c("kvobs_fleet_pooled_referenced_tokens_total", "{token}", (),
       "Tokens of every block the replicas stored to their GPUs (computed, loaded, or "
       "reported reused): the pooled what-if's references."),
    _g("kvobs_fleet_sampling_rate", "1", (),
       "Share of blocks followed (by a hash of the block, fleet-wide): counts are "
       "scaled by its inverse."),
    _g("kvobs_fleet_followed_blocks", "{block}", (),
       "Blocks held now that the aggregator follows (its memory)."),
    _c("kvobs_fleet_history_forgotten_blocks_total", "{block}", (),
       "Blocks held before that the aggregator forgot (its bound): their next "
       "computation reads cold."),
)

_BY_NAME = {spec.name: spec for spec in METRICS}


def by_name(name: str) -> MetricSpec:
    """The spec of metric ``name``; KeyError lists nothing else (the table is the docs)."""
    return _BY_NAME[name]


def markdown_table(specs: tuple[MetricSpec, ...] = METRICS) -> str:
    """``specs`` (the catalog) as a Markdown table, for the docs."""
    rows = ["| metric | type | labels | meaning |", "|---|---|---|---|"]
    for spec in specs:
        labels = ", ".join(spec.labels) or "-"
        rows.append(f"| `{spec.name}` | {spec.kind} | {labels} | {spec.help} |")
    return "\n".join(rows)
