"""Net benefit of the host pool: the prefill cost fit, saved seconds, residency, traces."""

from __future__ import annotations

import io
import json
import random

import pytest

from kvobs.benefit import PrefillCost
from kvobs.errors import ConfigError
from kvobs.pool import ServingLoop, TieredKVPool
from kvobs.pool.workload import ChatWorkload, WorkloadConfig
from kvobs.presets import preset_layout
from kvobs.recorder import Recorder
from kvobs.telemetry.summary import summary_fields
from kvobs.testing import capture_telemetry
from kvobs.trace import TraceWriter, read_trace


def test_the_fit_recovers_the_prefill_cost_from_noisy_steps_with_a_constant_decode_batch():
    rng, cost = random.Random(3), PrefillCost()
    for _ in range(400):
        prefill = rng.choice([0, 0, 128, 512, 2048])
        seconds = 0.004 + 3e-5 * prefill + 2e-4 * 64 + rng.gauss(0, 2e-4)
        cost.observe_step(seconds, prefill, 64)
    assert cost.source == "measured"
    assert cost.seconds_per_token == pytest.approx(3e-5, rel=0.05)


def test_a_fit_too_noisy_to_trust_is_not_used_and_says_how_poor_it_is():
    """Steps on a loaded machine: the prefill tokens explain little of the step time.
    The cost falls back to the configured one (or none), with the fit's error exported."""
    rng = random.Random(5)

    def loaded_steps(cost: PrefillCost, n: int = 400) -> None:
        for _ in range(n):
            prefill = rng.choice([0, 0, 32, 64])
            noise = rng.expovariate(1 / 0.02)  # other jobs stealing the core
            cost.observe_step(0.004 + 3e-5 * prefill + noise, prefill, 64)

    unknown = PrefillCost()
    loaded_steps(unknown)
    assert unknown.source == "none" and unknown.seconds_per_token == 0.0
    assert 0.1 < unknown.relative_error < float("inf")
    configured = PrefillCost()
    configured.set(2.5e-5)  # KVOBS_PREFILL_SECONDS_PER_TOKEN's, as telemetry's start sets it
    loaded_steps(configured)
    assert (configured.source, configured.seconds_per_token) == ("configured", 2.5e-5)
    rec = Recorder()
    rec.prefill_cost = unknown
    with capture_telemetry(rec) as telemetry:
        assert telemetry.value("kvobs_prefill_cost_relative_error") == \
            pytest.approx(unknown.relative_error)
        assert telemetry.value("kvobs_prefill_cost_info", source="none") == 1


def test_a_measured_cost_that_turns_poor_falls_back():
    rng, cost = random.Random(11), PrefillCost()
    for _ in range(300):  # a quiet machine: a tight fit
        prefill = rng.choice([0, 128, 512])
        cost.observe_step(0.004 + 3e-5 * prefill + rng.gauss(0, 1e-4), prefill, 64)
    assert cost.source == "measured" and cost.relative_error < 0.02
    for _ in range(4000):  # then steps whose time the tokens no longer explain
        prefill = rng.choice([0, 128, 512])
        cost.observe_step(rng.uniform(0.0, 0.5), prefill, 64)
    assert cost.source == "none" and cost.seconds_per_token == 0.0
    assert cost.relative_error > 0.1


def test_too_few_prefill_steps_measure_nothing_and_a_measured_cost_replaces_a_configured_one():
    cost = PrefillCost()
    cost.set(1e-5)
    for step in range(20):
        cost.observe_step(0.01 + 4e-5 * 100 * (step % 2), 100 * (step % 2), 8)
    assert (cost.source, cost.seconds_per_token) == ("configured", 1e-5)
    for step in range(60):
        cost.observe_step(0.01 + 4e-5 * 100 * (step % 3), 100 * (step % 3), 8)
    assert cost.source == "measured" and cost.seconds_per_token == pytest.approx(4e-5)
    with pytest.raises(ConfigError, match="finite number >= 0"):
        cost.set(float("inf"))
    with pytest.raises(ConfigError, match="configured or modelled"):
        cost.set(1e-5, "guessed")


def test_saved_seconds_need_a_known_cost_and_count_host_and_disk_hits():
    rec = Recorder()
    rec.lookup(1000, host_hit=500)
    assert rec.snapshot().benefit.host_saved_s == 0.0  # unknown cost: nothing claimed yet
    rec.prefill_cost.set(2e-5)  # ... and the 500 held tokens credited at the first cost
    rec.lookup(1000, gpu_hit=100, host_hit=300, disk_hit=200)
    benefit = rec.snapshot().benefit
    assert benefit.host_saved_s == pytest.approx((500 + 300) * 2e-5)
    assert benefit.disk_saved_s == pytest.approx(200 * 2e-5)
    with capture_telemetry(rec) as telemetry:
        assert telemetry.value("kvobs_prefill_cost_info", source="configured") == 1
        assert telemetry.value("kvobs_prefill_saved_seconds_total", tier="host") == \
            pytest.approx(1.6e-2)


@pytest.fixture(scope="module")
def served() -> Recorder:
    rec = Recorder(engine="demo", residency_rate=1.0)
    pool = TieredKVPool(preset_layout("qwen2.5-0.5b"), 128, 512, rec, device="cpu")
    ServingLoop(pool, ChatWorkload(WorkloadConfig(rate=2.0), seed=2)).run(90.0, pace=False)
    return rec


def test_the_demo_pool_saves_its_modelled_prefill_and_pays_measured_onloads(served):
    snap = served.snapshot()
    assert snap.benefit.prefill_cost_source == "modelled"
    assert snap.benefit.host_saved_s == pytest.approx(snap.lookups.host_hit / 40_000)
    assert snap.link("host", "gpu").seconds > 0
    fields = summary_fields(Recorder().snapshot(), snap, elapsed_s=90.0)
    saved, onload = snap.benefit.host_saved_s, snap.link("host", "gpu").seconds
    assert fields["host_pool"] == (f"host pool saved {saved:.3g} s of prefill for "
                                   f"{onload:.3g} s of onload in the last 90 s "
                                   f"(net {saved - onload:+.3g} s)")


def test_the_summary_says_unknown_for_onloads_the_engine_does_not_time():
    """SGLang on CPU onloads blocks without device times: the verdict is not 'free'."""
    rec = Recorder()
    rec.add_tier("gpu", 8, 16, 1024)
    rec.add_tier("host", 8, 16, 1024)
    rec.prefill_cost.set(0.01)
    before = rec.snapshot()
    rec.lookup(1000, host_hit=800)
    rec.link("host", "gpu").transfer(50, 0)  # moved, not timed
    assert summary_fields(before, rec.snapshot(), elapsed_s=60.0)["host_pool"] == (
        "host pool: onload time unknown (the engine does not time its onloads); 8 s of "
        "prefill saved in the last 60 s")
    assert summary_fields(before, Recorder().snapshot(), 60.0)["host_pool"] == "no host pool"


def test_a_short_closing_window_is_said_as_it_is():
    """The summary a stopping engine logs covers what is left since the last one: 0.05 s
    is 0.05 s, not "the last 0 s"."""
    rec = Recorder()
    rec.add_tier("host", 8, 16, 1024)
    rec.prefill_cost.set(0.01)
    before = rec.snapshot()
    rec.link("host", "gpu").transfer(1, 0, 0.001)
    said = {elapsed: summary_fields(before, rec.snapshot(), elapsed)["host_pool"]
            for elapsed in (0.05, 4.98, 60.0, 600.0)}
    assert [text.split("in the last ")[1].split(" (")[0] for text in said.values()] == [
        "0.05 s", "4.98 s", "60 s", "10 min"]


def test_residency_and_reuse_gaps_are_sampled_on_the_virtual_clock(served):
    with capture_telemetry(served) as telemetry:
        series = telemetry.collect()
    residency = {attrs["tier"]: count for attrs, count in series["kvobs_block_residency_seconds"]}
    gaps = {attrs["tier"]: count for attrs, count in series["kvobs_block_reuse_gap_seconds"]}
    host = served.snapshot().tier("host")
    assert residency["host"] == host.evictions_total  # every evicted host block, rate 1
    assert residency["gpu"] > 0 and gaps["host"] > 0
    assert gaps["host"] <= host.reuses


def test_a_trace_stops_at_its_size_bound_and_reads_back():
    out = io.StringIO()
    writer = TraceWriter(out, max_bytes=200, clock=lambda: 2.0)
    for request in range(10):
        writer.write([request, request + 1])
    lines = out.getvalue().splitlines()
    assert len(out.getvalue()) <= 200 and writer.skipped_lookups == 10 - len(lines)
    assert json.loads(lines[0]) == {"blocks": ["0000000000000000", "0000000000000001"],
                                    "ts": 2.0}
    records = list(read_trace(io.StringIO(out.getvalue())))
    assert [r.blocks[0] for r in records] == [f"{i:016x}" for i in range(len(lines))]
