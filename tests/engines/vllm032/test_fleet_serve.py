"""The fleet view against what the fleet really does (``fleet_run.py``): two ``vllm serve``
replicas, one chat workload routed round-robin and then by prefix affinity, ``kvobs fleet``
following both from their KV events alone.

* **The prediction**: under round-robin, the fleet's routing misses (tokens a replica
  computed while the other held them) added to vLLM's own hits predict the hit ratio the
  same workload reaches under prefix routing, and so does the pooled what-if at the
  fleet's capacity (one LRU cache of both replicas' blocks); each checked against that
  run's hit ratio from vLLM's own counters, within 0.03;
* **duplication and residency** equal the replicas' resident sets computed by the test from
  every KV event each replica published (its own subscriber, not kvobs's);
* the replicas restart between the runs, and the fleet reads each restart.
"""

from __future__ import annotations

import pytest

from tests.engines.vllm032.fleet_run import GPU_BLOCKS, POOLED, REPLICAS, Panels, Routed, run
from tests.engines.vllm032.serve_run import HOST_CHUNKS

TIER = {"GPU": "gpu", "CPU": "host"}


@pytest.fixture(scope="module")
def everything(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Routed], Panels]:
    runs, panels = run(tmp_path_factory.mktemp("fleet"))
    return {routed.routing: routed for routed in runs}, panels


@pytest.fixture(scope="module")
def runs(everything: tuple[dict[str, Routed], Panels]) -> dict[str, Routed]:
    return everything[0]


def resident(events: list[dict[str, object]]) -> dict[str, set[object]]:
    """Per tier, the blocks a replica holds after ``events`` (the test's own replay)."""
    held: dict[str, set[object]] = {"gpu": set(), "host": set()}
    for event in events:
        tier = TIER[str(event["medium"])]
        hashes = event["block_hashes"]
        assert isinstance(hashes, list)
        if event["kind"] == "BlockStored":
            held[tier].update(hashes)
        elif event["kind"] == "BlockRemoved":
            held[tier].difference_update(hashes)
        else:
            held[tier].clear()
    return held


def test_round_robin_routing_misses_predict_the_prefix_routed_hit_ratio(
        runs: dict[str, Routed]) -> None:
    rr, prefix = runs["round_robin"], runs["prefix"]
    routing = rr.fleet_delta("kvobs_fleet_computed_tokens_total", cause="routing")
    queried = rr.vllm_delta("vllm:prefix_cache_queries_total")
    assert queried == prefix.vllm_delta("vllm:prefix_cache_queries_total")  # the same prompts
    predicted = rr.hit_ratio + routing / queried
    print(f"\nfleet: hit ratio round-robin {rr.hit_ratio:.3f}; predicted by prefix "
          f"{predicted:.3f}; measured by prefix {prefix.hit_ratio:.3f}")
    assert prefix.hit_ratio - rr.hit_ratio > 0.1, (rr.hit_ratio, prefix.hit_ratio)
    assert predicted == pytest.approx(prefix.hit_ratio, abs=0.03), \
        (rr.hit_ratio, predicted, prefix.hit_ratio)
    # the pooled what-if at the fleet's capacity: one LRU cache of both replicas' blocks
    pooled = rr.fleet_delta("kvobs_fleet_pooled_hit_tokens_total", blocks=str(POOLED))
    print(f"fleet: pooled what-if at {POOLED} blocks {pooled / queried:.3f}")
    assert pooled / queried == pytest.approx(prefix.hit_ratio, abs=0.03)
    # by prefix, no replica computes what the other holds: the tenants never meet
    assert prefix.fleet_delta("kvobs_fleet_computed_tokens_total", cause="routing") == 0
    assert rr.sent.count(0) == rr.sent.count(1) + 1 and set(prefix.sent) == {0, 1}


def test_residency_and_duplication_equal_the_replicas_events(runs: dict[str, Routed]) -> None:
    for routed in runs.values():
        held = [resident(events) for events in routed.events]
        for name, mine in zip(REPLICAS, held, strict=True):
            for tier in ("gpu", "host"):
                assert _value(routed.fleet_after, "kvobs_fleet_resident_blocks", replica=name,
                              tier=tier) == len(mine[tier]), (routed.routing, name, tier)
            assert len(mine["gpu"]) < GPU_BLOCKS and len(mine["host"]) <= HOST_CHUNKS
        both = held[0]["gpu"] & held[1]["gpu"]
        got = routed.fleet_after
        assert _value(got, "kvobs_fleet_duplicated_blocks", tier="gpu") == len(both)
        assert _value(got, "kvobs_fleet_distinct_blocks", tier="gpu") == \
            len(held[0]["gpu"] | held[1]["gpu"])
    assert len(resident(runs["round_robin"].events[0])["gpu"] &
               resident(runs["round_robin"].events[1])["gpu"]) > 0


def test_the_fleet_reads_each_replica_restart_and_no_event_is_lost(
        runs: dict[str, Routed]) -> None:
    after = runs["prefix"].fleet_after
    for name in REPLICAS:
        assert _value(after, "kvobs_fleet_restarts_total", replica=name) == 1
        assert _value(after, "kvobs_fleet_gaps_total", replica=name, outcome="lost") == 0
        assert _value(after, "kvobs_fleet_skipped_events_total", replica=name) == 0
        assert _value(after, "kvobs_fleet_publisher_up", replica=name) == 1


def _value(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str,
           **labels: str) -> float:
    return sum(v for (n, got), v in samples.items() if n == name and
               set(labels.items()) <= got)


def test_every_fleet_panel_has_data_and_the_routing_share_is_the_fleets_own(
        everything: tuple[dict[str, Routed], Panels]) -> None:
    runs, panels = everything
    assert {stem for stem, *_ in panels.answers} == {"kvobs-fleet-cache"}
    for stem, title, expr, series in panels.answers:
        assert series and all(s.finite_samples for s in series), (stem, title, expr)
    [share] = [series for _, title, _, series in panels.answers
               if title == "Computed tokens routing by prefix would have served"]
    rr = runs["round_robin"]
    computed = rr.fleet_delta("kvobs_fleet_computed_tokens_total")
    routing = rr.fleet_delta("kvobs_fleet_computed_tokens_total", cause="routing")
    assert share[0].samples[-1][1] == pytest.approx(routing / computed, abs=0.02)

