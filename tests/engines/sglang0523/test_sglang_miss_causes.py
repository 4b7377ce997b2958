"""Why each token missed, inside SGLang 0.5.23's scheduler loop (``scheduler_loop``: the
real ``UnifiedRadixCache`` with HiCache write-through, a GPU pool of 48 pages and a host
pool of 96), on a workload whose causes are known by construction, and adding up to
SGLang's own missed tokens (its ``PrefillAdder``'s input tokens less device and host
hits)."""

from __future__ import annotations

import pytest

from kvobs.adapters.sglang import instrument_cache_controller, instrument_token_allocator
from kvobs.recorder import Recorder
from tests.engines.sglang0523.scheduler_loop import Engine, install_stand_ins

PAGE = 16
PAGES = 5     # whole pages per prompt
TAIL = 5      # tokens after them: never a hit


def prompt(n: int) -> list[int]:
    return [2000 + n * 100 + i for i in range(PAGES * PAGE + TAIL)]


def test_each_cause_equals_the_construction_within_a_page_per_request(
        monkeypatch: pytest.MonkeyPatch) -> None:
    install_stand_ins(monkeypatch)
    engine = Engine(tokens=768, page=PAGE, host_ratio=2.0, context=1024, max_reqs=4,
                    kv_events=True)
    host_pages = int(engine.host_pool.size) // PAGE
    rec = Recorder(engine="sglang")
    rec.add_tier("gpu", 768 // PAGE, PAGE, 0)
    rec.start_reuse_profile(capacity_blocks=host_pages)   # max(gpu, host): inclusive
    assert instrument_token_allocator(engine.allocator, rec, tree_cache=engine.tree).active
    assert instrument_cache_controller(engine.controller, rec).active

    def alone(n: int) -> None:
        engine.submit(prompt(n), max_new_tokens=1)
        engine.run()

    new, churn = range(4), range(4, 34)   # 150 pages of churn: more than the host holds
    for n in (*new, *churn):
        alone(n)
    for n in new:                          # back after the churn: evicted from both pools
        alone(n)
    requests = len(new) + len(churn) + len(new)
    causes = rec.snapshot().lookups.miss_causes()
    missed = engine.prompt_tokens - engine.device_hit_tokens - engine.host_hit_tokens
    assert sum(causes.values()) == missed
    whole = PAGES * PAGE
    assert causes["cold"] == (len(new) + len(churn)) * whole
    assert abs(causes["evicted"] - len(new) * whole) <= len(new) * PAGE
    assert causes["other"] <= len(new) * PAGE
    assert causes["not_cacheable"] == requests * TAIL
    assert causes["unknown"] == causes["dropped"] == causes["in_flight"] == 0
