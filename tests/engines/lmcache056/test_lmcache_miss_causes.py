"""Why each token missed, in a real LMCache 0.5.6 engine served as its vLLM connector
serves it (``ConnectorDriver``; a CPU backend of 24 chunks that evicts), on a workload
whose causes are known by construction, adding up to LMCache's own missed tokens (its
stats monitor's lookup tokens less lookup hits)."""

from __future__ import annotations

from kvobs.adapters.lmcache import instrument_lmcache_engine
from kvobs.recorder import Recorder
from tests.engines.lmcache056.lmcache_objects import (
    CHUNK,
    ConnectorDriver,
    build_engine,
    destroy,
    lmcache_metrics,
)

CHUNKS = 5    # whole chunks per prompt (LMCache looks up whole chunks only)


def prompt(n: int) -> list[int]:
    return [3000 + n * 100 + i for i in range(CHUNKS * CHUNK + 5)]


def test_each_cause_equals_the_construction_within_a_chunk_per_request() -> None:
    engine = build_engine()
    rec = Recorder(engine="lmcache")
    inst = instrument_lmcache_engine(engine, rec)
    try:
        engine.post_init()
        before = lmcache_metrics(engine)
        driver = ConnectorDriver(engine)
        new, churn = range(2), range(2, 8)   # 30 chunks of churn: more than the 24 held
        for n in (*new, *churn, *new):       # the first two back after the churn: evicted
            driver.serve(prompt(n))
        after = lmcache_metrics(engine)
        causes = rec.snapshot().lookups.miss_causes()
    finally:
        inst.unwrap()
        destroy()
    missed = (after["lookup_tokens"] - before["lookup_tokens"]) \
        - (after["lookup_hits"] - before["lookup_hits"])
    assert sum(causes.values()) == missed
    whole = CHUNKS * CHUNK
    assert causes["cold"] == (len(new) + len(churn)) * whole
    assert abs(causes["evicted"] - len(new) * whole) <= len(new) * CHUNK
    assert causes["other"] <= len(new) * CHUNK
    assert causes["not_cacheable"] == causes["unknown"] == 0
