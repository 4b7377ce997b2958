"""``/metrics`` (rendered from the snapshot) and OTLP (the OpenTelemetry bridge) carry the
same series with the same values for one recorder state: names from the catalog, every
label, every counter, gauge and histogram."""

from __future__ import annotations

import structlog
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kvobs.catalog import METRICS
from kvobs.telemetry.exposition import SnapshotCollector
from kvobs.testing import capture_telemetry
from tests.telemetry.scripted import scripted_recorder

Key = tuple[str, tuple[tuple[str, str], ...]]
KINDS = {spec.name: spec.kind for spec in METRICS}


def from_metrics(registry: CollectorRegistry) -> dict[Key, float]:
    """Catalog name -> value; a histogram reads as its sample count, like the capture."""
    found: dict[Key, float] = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for sample in family.samples:
            labels = tuple(sorted(sample.labels.items()))
            if sample.name == "target_info":
                continue
            if KINDS.get(family.name) == "histogram":
                if sample.name.endswith("_count"):
                    found[(family.name, labels)] = sample.value
                continue
            found[(sample.name, labels)] = sample.value
    return found


def test_metrics_and_otlp_carry_the_same_series_and_values() -> None:
    rec = scripted_recorder()
    registry = CollectorRegistry()
    registry.register(SnapshotCollector(rec))
    with structlog.testing.capture_logs(), capture_telemetry(rec) as telemetry:
        otlp = {(name, tuple(sorted(labels.items()))): value
                for name, values in telemetry.collect().items() for labels, value in values}
        scraped = from_metrics(registry)
    assert scraped == otlp
    names = {name for name, _ in scraped}
    assert {"kvobs_transfer_duration_seconds", "kvobs_block_residency_seconds",
            "kvobs_lookup_tokens_total", "kvobs_tier_resident_bytes"} <= names
    assert scraped[("kvobs_transfer_duration_seconds",
                    (("dst_tier", "gpu"), ("engine", "scripted"), ("model", "tiny"),
                     ("src_tier", "host")))] == 2
