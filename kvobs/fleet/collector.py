"""The fleet's series (:data:`kvobs.catalog.FLEET_METRICS`), read from its indexes at
collection time.

Counts of blocks and tokens are estimates scaled by the inverse of the sampling rate
(``kvobs_fleet_sampling_rate``; exact at rate 1). Every series carries ``model``; the
per-replica ones ``replica`` too. Sharded aggregators' series add up (``sum without
(instance)``).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kvobs.catalog import FLEET_LABELS, FLEET_METRICS, MetricSpec
from kvobs.fleet.index import CAUSES, TIERS, FleetIndex
from kvobs.fleet.subscriber import Subscriber


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
        families = {spec.name: _family(spec) for spec in FLEET_METRICS}

        def add(name: str, labels: list[str], value: float) -> None:
            families[name].add_metric(labels, value)

        with self.subscriber.lock:
            for model, index in self.indexes.items():
                scale = index.scale
                add("kvobs_fleet_sampling_rate", [model], index.sampling.rate)
                add("kvobs_fleet_followed_blocks", [model], index.followed_blocks)
                add("kvobs_fleet_history_forgotten_blocks_total", [model],
                    index.history_forgotten * scale)
                block = max(index.block_size, default=0)
                for bound, hits in index.pooled_hits():
                    if bound == float("inf"):
                        add("kvobs_fleet_pooled_referenced_tokens_total", [model],
                            hits * block)
                    else:
                        add("kvobs_fleet_pooled_hit_tokens_total", [model, f"{bound:g}"],
                            hits * block)
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


def _family(spec: MetricSpec) -> CounterMetricFamily | GaugeMetricFamily:
    labels = FLEET_LABELS + spec.labels
    if spec.kind == "counter":
        return CounterMetricFamily(spec.name.removesuffix("_total"), spec.help, labels=labels)
    return GaugeMetricFamily(spec.name, spec.help, labels=labels)
