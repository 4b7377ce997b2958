"""Every missed token gets a cause, and the causes add up to the missed tokens."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvobs.recorder import Recorder
from kvobs.reuse import ReuseProfile
from kvobs.snapshot import MISS_CAUSES

BLOCK = 16


def recorder(capacity_blocks: int = 8) -> Recorder:
    rec = Recorder()
    rec.add_tier("gpu", capacity_blocks, block_tokens=BLOCK, block_bytes=0)
    return rec


def causes(rec: Recorder) -> dict[str, int]:
    lookups = rec.snapshot().lookups
    found = lookups.miss_causes()
    assert sum(found.values()) == lookups.miss
    return found


def blocks(prefix: str, n: int) -> list[str]:
    return [f"{prefix}{i}" for i in range(n)]


def test_each_cause_by_construction():
    """Cold prompts, a repeat after churn beyond the capacity (evicted), a repeat within
    it that the engine missed anyway (other), a partial last block (not cacheable), a
    lookup without keys (unknown)."""
    rec = recorder(capacity_blocks=8)
    rec.lookup(4 * BLOCK + 5, keys=blocks("a", 4))          # 4 cold blocks + 5 tokens
    rec.lookup(4 * BLOCK, gpu_hit=2 * BLOCK, keys=blocks("a", 4))  # 2 missed within 8
    rec.lookup(10 * BLOCK, keys=blocks("churn", 10))        # 10 cold: a's now 10+ back
    rec.lookup(4 * BLOCK, keys=blocks("a", 4))              # 4 evicted
    rec.lookup(3 * BLOCK)                                   # no keys
    assert causes(rec) == {"cold": 14 * BLOCK, "evicted": 4 * BLOCK, "dropped": 0,
                           "in_flight": 0, "other": 2 * BLOCK, "not_cacheable": 5,
                           "unknown": 3 * BLOCK}
    # the evicted blocks were 14 blocks back: twice the capacity (16) would have kept them
    assert rec.snapshot().lookups.recoverable == 4 * BLOCK


def test_evicted_blocks_beyond_twice_the_capacity_are_not_recoverable():
    rec = recorder(capacity_blocks=8)
    rec.lookup(2 * BLOCK, keys=blocks("a", 2))
    rec.lookup(9 * BLOCK, keys=blocks("near", 9))   # a's 10 back: within 16
    rec.lookup(2 * BLOCK, keys=blocks("a", 2))
    rec.lookup(20 * BLOCK, keys=blocks("far", 20))  # a's 21 back: beyond 16
    rec.lookup(2 * BLOCK, keys=blocks("a", 2))
    lookups = rec.snapshot().lookups
    assert lookups.miss_causes()["evicted"] == 4 * BLOCK
    assert lookups.recoverable == 2 * BLOCK


def test_blocks_beyond_what_the_engine_could_hit_are_not_cacheable():
    """vLLM always computes a prompt's last token: a prompt of whole blocks can hit all
    but its last block, which is then not cacheable, not a policy miss."""
    rec = recorder()
    rec.lookup(4 * BLOCK, keys=blocks("a", 4), cacheable_tokens=4 * BLOCK - 1)
    rec.lookup(4 * BLOCK, gpu_hit=3 * BLOCK, keys=blocks("a", 4),
               cacheable_tokens=4 * BLOCK - 1)
    assert causes(rec) == {"cold": 3 * BLOCK, "evicted": 0, "dropped": 0, "in_flight": 0,
                           "other": 0, "not_cacheable": 2 * BLOCK, "unknown": 0}


def test_a_partly_hit_block_is_left_to_the_hit_and_the_rest_classified():
    rec = recorder()
    rec.lookup(3 * BLOCK, keys=blocks("a", 3))
    rec.lookup(3 * BLOCK, gpu_hit=BLOCK + 8, keys=blocks("a", 3))  # 8 tokens of block 1
    found = causes(rec)
    assert found["other"] == BLOCK and found["not_cacheable"] == 8  # block 2; block 1's rest


def test_an_adapters_explainer_splits_the_misses_within_the_capacity():
    """Of the blocks missed within the capacity, the ones the adapter says were refused
    are dropped, the ones still being offloaded in flight; it is asked about those only."""
    rec = recorder()
    asked = []

    def explain(keys):
        asked.append(list(keys))
        return sum(k == "a1" for k in keys), sum(k == "a2" for k in keys)

    rec.miss_explainer = explain
    rec.lookup(4 * BLOCK, keys=blocks("a", 4))
    rec.lookup(4 * BLOCK, gpu_hit=BLOCK, keys=blocks("a", 4))
    assert asked == [["a1", "a2", "a3"]]  # the cold ones are never asked about
    found = causes(rec)
    assert (found["dropped"], found["in_flight"], found["other"]) == (BLOCK, BLOCK, BLOCK)


def test_a_failing_or_overcounting_explainer_leaves_the_causes_adding_up():
    rec = recorder()
    rec.lookup(2 * BLOCK, keys=blocks("a", 2))
    rec.miss_explainer = lambda keys: (5, 5)          # more than were asked about
    rec.lookup(2 * BLOCK, keys=blocks("a", 2))
    assert causes(rec)["dropped"] == 2 * BLOCK and causes(rec)["in_flight"] == 0

    def broken(keys):
        raise RuntimeError("adapter bug")

    rec.miss_explainer = broken
    rec.lookup(2 * BLOCK, keys=blocks("a", 2))
    assert causes(rec)["other"] == 2 * BLOCK
    assert rec.snapshot().errors == {"recorder.miss_explainer": 1}


def test_without_the_reuse_profile_every_miss_is_unknown():
    rec = Recorder(profile_reuse=False)
    rec.add_tier("gpu", 8, block_tokens=BLOCK, block_bytes=0)
    rec.lookup(4 * BLOCK, gpu_hit=BLOCK, keys=blocks("a", 4))
    assert causes(rec)["unknown"] == 3 * BLOCK


def test_exported_series_add_up_to_the_missed_tokens():
    from kvobs.telemetry.series import snapshot_series

    rec = recorder()
    rec.lookup(4 * BLOCK + 3, gpu_hit=0, keys=blocks("a", 4))
    series = snapshot_series(rec.snapshot())
    causes_total = sum(v for labels, v in series["kvobs_miss_tokens_total"])
    missed = dict((labels["outcome"], v) for labels, v in series["kvobs_lookup_tokens_total"])
    assert causes_total == missed["miss"] == 4 * BLOCK + 3
    assert {labels["cause"] for labels, _ in series["kvobs_miss_tokens_total"]} \
        == set(MISS_CAUSES)


lookups = st.lists(st.tuples(
    st.lists(st.integers(0, 40), min_size=0, max_size=12),  # block keys
    st.integers(0, 20),   # hit blocks
    st.integers(0, 15),   # extra tokens
    st.booleans(),        # keyed
    st.booleans(),        # the last token always computed
), max_size=40)


@settings(max_examples=200, deadline=None)
@given(lookups)
def test_causes_always_add_up_to_the_missed_tokens(calls):
    rec = recorder(capacity_blocks=6)
    for keys, hit_blocks, extra, keyed, last_token in calls:
        tokens = len(keys) * BLOCK + extra
        hit = min(hit_blocks, len(keys)) * BLOCK
        rec.lookup(tokens, gpu_hit=hit, keys=keys if keyed else None,
                   cacheable_tokens=tokens - 1 if last_token else None)
        causes(rec)


@pytest.mark.parametrize("exact_keys", [None, 0])
def test_sampled_causes_estimate_cold_and_evicted_within_a_few_percent(exact_keys):
    """Beyond the profile's exact budget, cold and evicted come from the sampled blocks:
    16,000 blocks and 4,000 repeats from 4,000 to 8,000 blocks back (beyond the
    capacity, within the horizon of 16x it) on a profile tracking 2,048 at most."""
    capacity, n = 1000, 8000
    profile = ReuseProfile(capacity, max_keys=2048, exact_keys=exact_keys)
    assert profile.rate < 1
    references = [[k] for k in range(n)] + [[k] for k in range(0, n, 2)] \
        + [[k] for k in range(n, 2 * n, 2)]
    cold = evicted = other = 0
    for keys in references:
        c, e, o, _ = profile.written_then_reference([], keys, 0, 1, capacity)
        cold, evicted, other = cold + c, evicted + e, other + o
    # every block once (cold), the even ones again 4,000 to 8,000 blocks later (evicted:
    # beyond 1,000), then 4,000 new ones (cold)
    true_cold, true_evicted = n + n // 2, n // 2
    assert cold + evicted + other == len(references)
    assert cold == pytest.approx(true_cold, rel=0.05)
    assert evicted == pytest.approx(true_evicted, rel=0.1)
