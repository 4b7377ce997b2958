"""The fleet index against a plain replay of the same events (``fleet_oracle``): residency,
duplication and every computed block's cause, exact at rate 1; sampled estimates near the
truth; shards that partition the blocks; the history's bound."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvobs.errors import ConfigError
from kvobs.fleet.index import CAUSES, TIERS, FleetIndex, Sampling
from tests.fleet.fleet_oracle import FleetOracle
from tests.lru_oracle import reuse_distances_in_order

REPLICAS = 3
event = st.tuples(
    st.sampled_from(["stored", "stored", "removed", "cleared"]),
    st.integers(0, REPLICAS - 1),
    st.sampled_from(["gpu", "gpu", "host", "disk"]),
    st.lists(st.integers(0, 40), min_size=1, max_size=6),
    st.sampled_from([1, 16]),
)


def replay(events: list[tuple[str, int, str, list[int], int]],
           index: FleetIndex) -> FleetOracle:
    oracle = FleetOracle()
    for n in range(REPLICAS):
        index.replica(f"r{n}")
    for kind, replica, tier, keys, size in events:
        if kind == "stored":
            index.stored(replica, tier, keys, size)
            oracle.stored(replica, tier, keys, size)
        elif kind == "removed":
            index.removed(replica, tier, keys)
            oracle.removed(replica, tier, keys)
        else:
            index.cleared(replica, tier)
            oracle.cleared(replica, tier)
    return oracle


@settings(max_examples=300, deadline=None)
@given(st.lists(event, max_size=60))
def test_every_count_equals_a_plain_replay(events: list[tuple[str, int, str, list[int], int]]) \
        -> None:
    index = FleetIndex()
    oracle = replay(events, index)
    for replica in range(REPLICAS):
        for tier in TIERS:
            assert index.resident[replica][tier] == len(oracle.tier(replica, tier))
            assert index.loaded_tokens[replica][tier] == oracle.loaded[(replica, tier)]
        for cause in CAUSES:
            assert index.computed_tokens[replica][cause] == oracle.computed[(replica, cause)], \
                (replica, cause)
        assert index.reused_tokens[replica] == oracle.reused[replica]
    for tier in TIERS:
        copies = oracle.copies(tier)
        assert index.distinct(tier) == len(copies)
        assert index.duplicated(tier) == (sum(1 for c in copies.values() if c >= 2),
                                          sum(c - 1 for c in copies.values()))


def test_a_prefix_computed_on_two_replicas_is_a_routing_miss_on_the_second() -> None:
    index = FleetIndex()
    a, b = index.replica("a"), index.replica("b")
    index.stored(a, "gpu", [1, 2, 3], 16)
    index.stored(a, "host", [1, 2, 3], 16)
    index.removed(a, "gpu", [1, 2, 3])       # still on a's host tier
    index.stored(b, "gpu", [1, 2, 4], 16)
    assert index.computed_tokens[b] == {"routing": 32, "evicted": 0, "evicted_elsewhere": 0,
                                        "cold": 16}
    index.stored(a, "gpu", [1], 16)          # a loads its own host copy
    assert index.loaded_tokens[a]["host"] == 16
    index.removed(b, "gpu", [4])
    index.stored(b, "gpu", [4], 16)
    index.removed(b, "gpu", [4])
    index.stored(a, "gpu", [4], 16)
    assert index.computed_tokens[b]["evicted"] == 16
    assert index.computed_tokens[a]["evicted_elsewhere"] == 16


def test_sampled_estimates_near_the_truth_and_shards_add_up() -> None:
    rnd = random.Random(7)
    events = []
    for _ in range(20_000):
        replica = rnd.randrange(REPLICAS)
        keys = [rnd.randrange(50_000) for _ in range(4)]
        events.append(("stored", replica, "gpu", keys, 16))
        if rnd.random() < 0.4:
            events.append(("removed", replica, "gpu", keys[:2], 16))
    exact = FleetIndex()
    replay(events, exact)
    sampled = FleetIndex(Sampling(rate=1 / 8, salt=99))
    replay(events, sampled)
    shards = [FleetIndex(Sampling(rate=1.0, salt=5, shard=i, shards=4)) for i in range(4)]
    for shard in shards:
        replay(events, shard)
    true_dup = exact.duplicated("gpu")[0]
    assert true_dup > 1000
    assert sampled.duplicated("gpu")[0] == pytest.approx(true_dup, rel=0.1)
    routing = sum(exact.computed_tokens[r]["routing"] for r in range(REPLICAS))
    assert sum(sampled.computed_tokens[r]["routing"] for r in range(REPLICAS)) * 8 == \
        pytest.approx(routing, rel=0.1)
    # the shards follow disjoint blocks that together are every block: their counts add up
    assert sum(s.duplicated("gpu")[0] for s in shards) == true_dup
    assert sum(s.distinct("gpu") for s in shards) == exact.distinct("gpu")
    for cause in CAUSES:
        assert sum(s.computed_tokens[r][cause] for s in shards for r in range(REPLICAS)) == \
            sum(exact.computed_tokens[r][cause] for r in range(REPLICAS))


def test_the_history_is_bounded_and_a_forgotten_block_reads_cold() -> None:
    index = FleetIndex(history_keys=2)
    a = index.replica("a")
    for key in (1, 2, 3):
        index.stored(a, "gpu", [key], 16)
        index.removed(a, "gpu", [key])
    assert index.history_blocks == 2 and index.history_forgotten == 1
    index.stored(a, "gpu", [1, 3], 16)  # 1 was forgotten, 3 was not
    assert index.computed_tokens[a]["cold"] == 3 * 16 + 16
    assert index.computed_tokens[a]["evicted"] == 16


def test_a_store_of_unknown_size_counts_the_replicas_last_known_size() -> None:
    index = FleetIndex()
    a, b = index.replica("a"), index.replica("b")
    index.stored(a, "gpu", [1], 32)
    index.stored(b, "gpu", [2], 16)
    index.stored(a, "gpu", [3], 0)
    assert index.computed_tokens[a]["cold"] == 64


def test_a_removal_of_a_block_never_stored_is_ignored() -> None:
    index = FleetIndex()
    a = index.replica("a")
    index.removed(a, "gpu", [5])
    assert index.resident[a]["gpu"] == 0 and index.distinct("gpu") == 0


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"rate": 0.0}, "sampling rate"), ({"rate": 1.5}, "sampling rate"),
    ({"salt": -1}, "salt"), ({"shard": 4, "shards": 4}, "shard 4/4"),
])
def test_bad_sampling_names_the_field(kwargs: dict[str, float], field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        Sampling(**kwargs)  # type: ignore[arg-type]


def test_the_pooled_what_if_hits_what_one_shared_lru_cache_would() -> None:
    """Every GPU store of every replica, in arrival order, against an exact LRU replay of
    the same stream (``tests/lru_oracle.py``): at each of the profile's sizes."""
    rnd = random.Random(11)
    index = FleetIndex(Sampling(rate=1 / 4, salt=3), pooled_capacity=64)  # sampling aside
    for n in range(REPLICAS):
        index.replica(f"r{n}")
    stream: list[int] = []
    for _ in range(600):
        keys = [rnd.randrange(300) for _ in range(rnd.randrange(1, 6))]
        index.stored(rnd.randrange(REPLICAS), "gpu", keys, 16)
        index.stored(rnd.randrange(REPLICAS), "host", keys[:1], 16)  # not a reference
        stream.extend(keys)
    distances = reuse_distances_in_order([(key, True) for key in stream])
    pooled = index.pooled_hits()
    assert pooled[-1] == (float("inf"), len(stream))
    for bound, hits in pooled[:-1]:
        assert hits == sum(1 for d in distances if d is not None and d <= bound), bound
    assert pooled[0][1] < pooled[-2][1]
