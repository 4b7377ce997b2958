"""The fleet's series, read from its indexes at collection time.

Counts of blocks and tokens are estimates scaled by the inverse of the sampling rate
(``kvobs_fleet_sampling_rate``; exact at rate 1). Every series carries ``model``; the
per-replica ones ``replica`` too. Sharded aggregators' series add up (``sum without
(instance)``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kvobs.fleet.index import CAUSES, TIERS, FleetIndex
from kvobs.fleet.subscriber import Subscriber


@dataclass(frozen=True)
class FleetSeries:
    """One exported series: its name, kind, labels and help."""

    name: str
    kind: str
    labels: tuple[str, ...]
    help: str


_R, _RT = ("model", "replica"), ("model", "replica", "tier")
#: Every series ``kvobs fleet`` exports (the metrics reference lists them).
SERIES: tuple[FleetSeries, ...] = (
    FleetSeries("kvobs_fleet_resident_blocks", "gauge", _RT,
                "KV blocks each replica holds in each tier, from its KV events."),
    FleetSeries("kvobs_fleet_resident_bytes", "gauge", _RT,
                "The same in bytes (--block-bytes given)."),
    FleetSeries("kvobs_fleet_distinct_blocks", "gauge", ("model", "tier"),
                "Blocks held in the tier by at least one replica."),
    FleetSeries("kvobs_fleet_duplicated_blocks", "gauge", ("model", "tier"),
                "Blocks held in the tier by two or more replicas."),
    FleetSeries("kvobs_fleet_duplicate_copies_blocks", "gauge", ("model", "tier"),
                "Copies of those blocks beyond the first: the tier's capacity the fleet "
                "spends holding a block twice."),
    FleetSeries("kvobs_fleet_stored_blocks_total", "counter", _RT,
                "Blocks each replica stored in each tier (BlockStored)."),
    FleetSeries("kvobs_fleet_removed_blocks_total", "counter", _RT,
                "Blocks each replica removed from each tier (BlockRemoved)."),
    FleetSeries("kvobs_fleet_computed_tokens_total", "counter", ("model", "replica", "cause"),
                "Tokens of blocks a replica computed and stored to its GPU, by why no copy "
                "served them: routing (another replica held the block, in any tier: routing "
                "by prefix would have hit it), evicted (this replica held it before), "
                "evicted_elsewhere (only other replicas held it before), cold (no replica "
                "held it before)."),
    FleetSeries("kvobs_fleet_loaded_tokens_total", "counter", _RT,
                "Tokens of blocks a replica stored to its GPU from one of its own lower "
                "tiers (host hits)."),
    FleetSeries("kvobs_fleet_reused_tokens_total", "counter", _R,
                "Tokens of blocks a replica reported reused on its GPU (vLLM's "
                "kv_cache_report_mode=full; 0 otherwise)."),
    FleetSeries("kvobs_fleet_cleared_total", "counter", _R,
                "Times a replica cleared its prefix cache (AllBlocksCleared)."),
    FleetSeries("kvobs_fleet_event_batches_total", "counter", _R,
                "Event batches read from each replica."),
    FleetSeries("kvobs_fleet_skipped_events_total", "counter", ("model", "replica", "reason"),
                "Events skipped: malformed_batch (a payload that is no batch), malformed "
                "(an event missing a field), unknown (an event type or medium this kvobs "
                "does not know)."),
    FleetSeries("kvobs_fleet_gaps_total", "counter", ("model", "replica", "outcome"),
                "Gaps in a replica's batch sequence: replayed (asked again and applied), "
                "lost (the publisher no longer held them: the replica's entries were "
                "dropped and refill from its new events)."),
    FleetSeries("kvobs_fleet_lost_batches_total", "counter", _R, "Batches lost in gaps."),
    FleetSeries("kvobs_fleet_restarts_total", "counter", _R,
                "Times a replica's batch sequence started again (an engine restart)."),
    FleetSeries("kvobs_fleet_errors_total", "counter", _R,
                "Errors reading a replica's events (logged at most once a minute)."),
    FleetSeries("kvobs_fleet_publisher_up", "gauge", _R,
                "1 if the replica's replay endpoint answered the last probe, 0 if not "
                "(only where a replay endpoint is given)."),
    FleetSeries("kvobs_fleet_last_batch_timestamp_seconds", "gauge", _R,
                "The engine's timestamp of the last batch read from the replica."),
    FleetSeries("kvobs_fleet_sampling_rate", "gauge", ("model",),
                "Share of blocks followed (by a hash of the block, fleet-wide): counts are "
                "scaled by its inverse."),
    FleetSeries("kvobs_fleet_followed_blocks", "gauge", ("model",),
                "Blocks held now that the aggregator follows (its memory)."),
    FleetSeries("kvobs_fleet_history_forgotten_blocks_total", "counter", ("model",),
                "Blocks held before that the aggregator forgot (its bound): their next "
                "computation reads cold."),
)


class FleetCollector(Collector):
    """Collects :data:`SERIES` from the subscriber's indexes, under its lock."""

    def __init__(self, subscriber: Subscriber, indexes: dict[str, FleetIndex],
                 block_bytes: int | None = None) -> None:
        self.subscriber = subscriber
        self.indexes = indexes
        self.block_bytes = block_bytes

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        families = {series.name: _family(series) for series in SERIES}

        def add(name: str, labels: list[str], value: float) -> None:
            families[name].add_metric(labels, value)

        with self.subscriber.lock:
            for model, index in self.indexes.items():
                scale = index.scale
                add("kvobs_fleet_sampling_rate", [model], index.sampling.rate)
                add("kvobs_fleet_followed_blocks", [model], index.followed_blocks)
                add("kvobs_fleet_history_forgotten_blocks_total", [model],
                    index.history_forgotten * scale)
                for tier in TIERS:
                    duplicated, extra = index.duplicated(tier)
                    add("kvobs_fleet_distinct_blocks", [model, tier], index.distinct(tier))
                    add("kvobs_fleet_duplicated_blocks", [model, tier], duplicated)
                    add("kvobs_fleet_duplicate_copies_blocks", [model, tier], extra)
            for state in self.subscriber.replicas:
                index, n = state.index, state.replica
                model, name = state.endpoint.model, state.endpoint.name
                scale = index.scale
                for tier in TIERS:
                    labels = [model, name, tier]
                    add("kvobs_fleet_resident_blocks", labels, index.resident[n][tier] * scale)
                    if self.block_bytes:
                        add("kvobs_fleet_resident_bytes", labels,
                            index.resident[n][tier] * scale * self.block_bytes)
                    add("kvobs_fleet_stored_blocks_total", labels,
                        index.stored_blocks[n][tier] * scale)
                    add("kvobs_fleet_removed_blocks_total", labels,
                        index.removed_blocks[n][tier] * scale)
                    add("kvobs_fleet_loaded_tokens_total", labels,
                        index.loaded_tokens[n][tier] * scale)
                for cause in CAUSES:
                    add("kvobs_fleet_computed_tokens_total", [model, name, cause],
                        index.computed_tokens[n][cause] * scale)
                add("kvobs_fleet_reused_tokens_total", [model, name],
                    index.reused_tokens[n] * scale)
                add("kvobs_fleet_cleared_total", [model, name], index.clears[n])
                add("kvobs_fleet_event_batches_total", [model, name], state.batches)
                for reason, count in state.skipped.items():
                    add("kvobs_fleet_skipped_events_total", [model, name, reason], count)
                for outcome, count in state.gaps.items():
                    add("kvobs_fleet_gaps_total", [model, name, outcome], count)
                add("kvobs_fleet_lost_batches_total", [model, name], state.lost_batches)
                add("kvobs_fleet_restarts_total", [model, name], state.restarts)
                add("kvobs_fleet_errors_total", [model, name], state.errors)
                if state.up is not None:
                    add("kvobs_fleet_publisher_up", [model, name], state.up)
                if state.last_batch_ts is not None:
                    add("kvobs_fleet_last_batch_timestamp_seconds", [model, name],
                        state.last_batch_ts)
        yield from families.values()


def _family(series: FleetSeries) -> CounterMetricFamily | GaugeMetricFamily:
    if series.kind == "counter":
        return CounterMetricFamily(series.name.removesuffix("_total"), series.help,
                                   labels=series.labels)
    return GaugeMetricFamily(series.name, series.help, labels=series.labels)
