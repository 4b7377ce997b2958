"""Miss causes on the real engine against a workload whose causes are known by
construction: ``vllm serve`` (``serve_run.start_server``: 31 usable GPU blocks, a host
tier of 48 chunks, blocks of 32 tokens, kvobs by its plugin), prompts sent as token ids
one at a time over ``/v1/completions``:

* **A**: 4 new prompts of 3 whole blocks and 5 tokens: 3 blocks each ``cold``, 5 tokens
  each ``not_cacheable`` (a partial last block);
* **B**: 20 more new prompts alike (60 blocks: more than either tier holds, so A's blocks
  leave the GPU pool and then the host tier, both LRU);
* **C**: A's 4 prompts again: 3 blocks each ``evicted`` (seen 60 blocks back, past the
  largest tier's 48, well within the profile's horizon), 5 tokens each ``not_cacheable``;
* **D**: B's last prompt again: its blocks still on the GPU, a GPU hit.

Each cause must equal the construction's count exactly, and the causes must add up to
vLLM's own missed tokens (its prefix-cache queries less its GPU and connector hits).
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from tests.engines.vllm032.engine_run import BLOCK
from tests.engines.vllm032.serve_run import Server, http_json, start_server
from tests.fleet.scrape import scrape, value

WHOLE, PARTIAL = 3, 5          # whole blocks and tokens past them, a prompt
FIRST, CHURN = 4, 20           # prompts in A (repeated in C) and in B


@pytest.fixture(scope="module")
def causes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, float]:
    workdir: Path = tmp_path_factory.mktemp("miss-construction")
    server: Server = start_server(workdir, f"ipc://{workdir}/kv-events", max_num_seqs=1)
    try:
        server.wait_ready()
        rnd = random.Random(3)
        prompts = [[rnd.randrange(2, 500) for _ in range(WHOLE * BLOCK + PARTIAL)]
                   for _ in range(FIRST + CHURN)]
        before = scrape(f"{server.url}/metrics")
        for prompt in [*prompts, *prompts[:FIRST], prompts[-1]]:
            http_json(f"{server.url}/v1/completions", {
                "model": "tiny", "prompt": prompt, "max_tokens": 1, "temperature": 0.0})
        # one more short request steps the engine until the last offloads are reported
        http_json(f"{server.url}/v1/completions", {"model": "tiny", "prompt": [7],
                                                   "max_tokens": 1})
        after = scrape(f"{server.url}/metrics")
        kvobs = scrape(f"http://127.0.0.1:{server.kvobs_port}/metrics")
    finally:
        server.stop()

    def vllm(name: str) -> float:
        return value(after, name) - value(before, name)

    got = {cause: value(kvobs, "kvobs_miss_tokens_total", cause=cause)
           for cause in ("cold", "evicted", "dropped", "in_flight", "other",
                         "not_cacheable", "unknown")}
    got["vllm_missed"] = (vllm("vllm:prefix_cache_queries_total")
                          - vllm("vllm:prefix_cache_hits_total")
                          - vllm("vllm:external_prefix_cache_hits_total"))
    got["kvobs_missed"] = value(kvobs, "kvobs_lookup_tokens_total", outcome="miss")
    got["gpu_hit"] = value(kvobs, "kvobs_lookup_tokens_total", outcome="gpu_hit")
    return got


def test_each_cause_equals_the_construction(causes: dict[str, float]) -> None:
    prompts = FIRST + CHURN + FIRST + 1
    short = 1  # the last request's one token: a partial block
    assert causes["cold"] == (FIRST + CHURN) * WHOLE * BLOCK
    assert causes["evicted"] == FIRST * WHOLE * BLOCK
    # every prompt's 5 tokens past its whole blocks, and D's 3 whole blocks a GPU hit
    assert causes["not_cacheable"] == prompts * PARTIAL + short
    assert causes["dropped"] == causes["in_flight"] == causes["other"] == 0
    assert causes["unknown"] == 0
    assert causes["gpu_hit"] == WHOLE * BLOCK


def test_the_causes_add_up_to_vllms_missed_tokens(causes: dict[str, float]) -> None:
    total = sum(causes[c] for c in ("cold", "evicted", "dropped", "in_flight", "other",
                                    "not_cacheable", "unknown"))
    assert total == causes["kvobs_missed"] == causes["vllm_missed"]

