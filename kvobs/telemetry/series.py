"""Turn a recorder snapshot into labelled values, one list per catalog metric.

This is the only place that knows which snapshot field feeds which series, so the
OpenTelemetry bridge, tests and the summary log agree on every number. It imports no
telemetry library.

Example:
    >>> from kvobs.recorder import Recorder
    >>> rec = Recorder(engine="demo", model="m")
    >>> _ = rec.add_tier("gpu", capacity_blocks=4, block_tokens=16, block_bytes=1024)
    >>> rec.lookup(32, gpu_hit=16)
    >>> series = snapshot_series(rec.snapshot())
    >>> series["kvobs_lookup_tokens_total"][-1]
    ({'outcome': 'miss'}, 16)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from kvobs.catalog import RESIDENT_STATES
from kvobs.snapshot import RecorderSnapshot

if TYPE_CHECKING:
    from kvobs.recorder import Recorder

Labels = dict[str, str]
Series = dict[str, list[tuple[Labels, float]]]
#: Extra sources (NVML...) return values for catalog metrics the recorder does not own.
SeriesSource = Callable[[], Mapping[str, list[tuple[Labels, float]]]]


def snapshot_series(snap: RecorderSnapshot) -> Series:
    """Values of every recorder-owned catalog metric, without the common labels."""
    series: Series = {}

    def add(name: str, labels: Labels, value: float) -> None:
        series.setdefault(name, []).append((labels, value))

    for t in snap.tiers:
        tier = {"tier": t.tier}
        add("kvobs_tier_capacity_blocks", tier, t.capacity_blocks)
        if t.block_tokens > 0:  # no whole token count per block: no token series, never a 0
            add("kvobs_tier_capacity_tokens", tier, t.capacity_blocks * t.block_tokens)
        known_bytes = t.block_bytes > 0  # unknown block size: no byte series, never a 0
        if known_bytes:
            add("kvobs_tier_capacity_bytes", tier, t.capacity_blocks * t.block_bytes)
        for state, blocks in zip(RESIDENT_STATES, (t.in_use_blocks, t.cached_blocks), strict=True):
            add("kvobs_tier_resident_blocks", {**tier, "state": state}, blocks)
            if known_bytes:
                add("kvobs_tier_resident_bytes", {**tier, "state": state},
                    blocks * t.block_bytes)
        add("kvobs_block_allocations_total", tier, t.allocations)
        add("kvobs_block_frees_total", tier, t.frees)
        add("kvobs_block_reuses_total", tier, t.reuses)
        add("kvobs_block_stores_total", tier, t.stores)
        for reason, count in t.evictions.items():
            add("kvobs_block_evictions_total", {**tier, "reason": reason}, count)

    add("kvobs_lookups_total", {}, snap.lookups.lookups)
    for outcome, tokens in snap.lookups.outcomes().items():
        add("kvobs_lookup_tokens_total", {"outcome": outcome}, tokens)
    for cause, tokens in snap.lookups.miss_causes().items():
        add("kvobs_miss_tokens_total", {"cause": cause}, tokens)
    add("kvobs_miss_recoverable_tokens_total", {}, snap.lookups.recoverable)
    if snap.relookups is not None:
        add("kvobs_preempted_lookups_total", {}, snap.relookups.lookups)
        for outcome, tokens in snap.relookups.outcomes().items():
            add("kvobs_preempted_lookup_tokens_total", {"outcome": outcome}, tokens)

    for link in snap.links:
        if not link.counts:  # a timing-only link exports its durations alone
            continue
        direction = {"src_tier": link.src, "dst_tier": link.dst}
        add("kvobs_transfer_operations_total", direction, link.operations)
        add("kvobs_transfer_blocks_total", direction, link.blocks)
        add("kvobs_transfer_bytes_total", direction, link.bytes)
        add("kvobs_transfer_failures_total", direction, link.failures)
        add("kvobs_transfer_drops_total", direction, link.drops)
        add("kvobs_transfer_seconds_total", direction, link.seconds)

    benefit = snap.benefit
    add("kvobs_prefill_saved_seconds_total", {"tier": "host"}, benefit.host_saved_s)
    add("kvobs_prefill_saved_seconds_total", {"tier": "disk"}, benefit.disk_saved_s)
    if benefit.prefill_cost_source != "none":  # unknown is a gap, not a cost of 0
        add("kvobs_prefill_cost_seconds", {}, benefit.prefill_seconds_per_token)
    add("kvobs_prefill_cost_info", {"source": benefit.prefill_cost_source}, 1)
    if benefit.prefill_cost_relative_error != float("inf"):  # only once a fit was made
        add("kvobs_prefill_cost_relative_error", {}, benefit.prefill_cost_relative_error)
    if snap.reuse is not None:
        reuse = snap.reuse
        add("kvobs_reuse_references_total", {}, reuse.references)
        for bound, counted in reuse.cumulative:
            le = "+Inf" if bound == float("inf") else str(int(bound))
            add("kvobs_reuse_sampled_references_total", {"le": le}, counted)
        add("kvobs_reuse_sample_rate", {}, reuse.rate)
        add("kvobs_reuse_tracking_rate", {}, reuse.tracking_rate)
        add("kvobs_reuse_exact_blocks", {}, reuse.exact_blocks)
        add("kvobs_reuse_capacity_blocks", {}, reuse.capacity_blocks)
        add("kvobs_reuse_forgotten_blocks_total", {}, reuse.forgotten)

    add("kvobs_thrash_onloads_total", {}, snap.thrash.onloads_in_window)
    add("kvobs_offloaded_reused_blocks_total", {}, snap.thrash.offloaded_reused)
    add("kvobs_offloaded_evicted_unused_blocks_total", {}, snap.thrash.offloaded_evicted_unused)
    add("kvobs_thrash_untracked_blocks_total", {}, snap.thrash.untracked_blocks)
    for component, count in snap.errors.items():
        add("kvobs_instrumentation_errors_total", {"component": component}, count)
    add("kvobs_telemetry_dropped_samples_total", {}, snap.dropped_samples)
    return series


def recorder_series(recorder: Recorder, sources: Sequence[SeriesSource] = ()) -> Series:
    """:func:`snapshot_series` of one snapshot of ``recorder``, plus what its own sources
    (:meth:`~kvobs.recorder.Recorder.add_source`) and ``sources`` add;
    a source that raises is counted (``telemetry.source``) and left out."""
    series = snapshot_series(recorder.snapshot())
    for source in (*recorder.sources, *sources):
        try:
            extra = {name: list(values) for name, values in source().items()}
        except Exception as exc:
            recorder.error("telemetry.source", exc)
            continue
        for name, values in extra.items():
            series.setdefault(name, []).extend(values)
    return series
