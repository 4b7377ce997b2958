"""Why each token missed, in a real vLLM engine loop (a real Scheduler on CPU, driven
step by step): a workload whose causes are known by construction, and the causes adding
up to vLLM's own missed tokens (its PrefixCacheStats queries less hits, less the
connector's host hits)."""

from __future__ import annotations

from pathlib import Path

from kvobs.adapters.vllm import instrument_scheduler
from kvobs.recorder import Recorder
from tests.engines.vllm.vllm_engine import EngineDriver, build_scheduler

BLOCK = 16
PROMPT_BLOCKS = 5
TAIL = 5  # tokens after the prompt's whole blocks: never a hit


def prompt(n: int) -> list[int]:
    """Prompt ``n``: tokens no other prompt shares (5 whole blocks and 5 more)."""
    return [1000 + n * 100 + i for i in range(PROMPT_BLOCKS * BLOCK + TAIL)]


def run_alone(driver: EngineDriver, request_id: str, tokens: list[int]) -> None:
    driver.add(request_id, tokens, max_tokens=1)
    while driver.busy:
        driver.step()


def vllm_missed(driver: EngineDriver) -> int:
    return driver.prefix_queries - driver.prefix_hits - driver.connector_hits


def test_each_cause_equals_the_construction_and_adds_up_to_vllms_misses(tmp_path: Path):
    driver = EngineDriver(build_scheduler(tmp_path, gpu_blocks=41, cpu_bytes=None))
    rec = Recorder(engine="vllm", model="test")
    instrument_scheduler(driver.scheduler, rec)
    capacity = rec.start_reuse_profile().capacity_blocks  # 40 blocks: vLLM's, less null
    assert capacity == 40

    for n in range(4):                      # new prompts: cold
        run_alone(driver, f"new{n}", prompt(n))
    for n in range(4, 12):                  # 40 blocks more: the first four are evicted
        run_alone(driver, f"churn{n}", prompt(n))
    for n in range(4):                      # back after 40+ other blocks: evicted
        run_alone(driver, f"back{n}", prompt(n))
    run_alone(driver, "again11", prompt(11))  # 20 blocks back: vLLM hits it

    causes = rec.snapshot().lookups.miss_causes()
    whole = PROMPT_BLOCKS * BLOCK
    assert causes == {"cold": 12 * whole, "evicted": 4 * whole, "dropped": 0, "in_flight": 0,
                      "other": 0, "not_cacheable": 17 * TAIL, "unknown": 0}
    assert sum(causes.values()) == vllm_missed(driver) == 16 * whole + 17 * TAIL
    assert driver.prefix_hits == whole  # the one repeat within the capacity


def test_a_prompt_of_whole_blocks_leaves_its_last_block_to_vllms_last_token(tmp_path: Path):
    """vLLM computes a prompt's last token, so a repeat of whole blocks hits all but the
    last one: its tokens are not cacheable, not a miss the cache could have avoided."""
    driver = EngineDriver(build_scheduler(tmp_path, gpu_blocks=41, cpu_bytes=None))
    rec = Recorder(engine="vllm", model="test")
    instrument_scheduler(driver.scheduler, rec)
    tokens = prompt(0)[: 4 * BLOCK]
    run_alone(driver, "first", tokens)
    run_alone(driver, "again", tokens)
    causes = rec.snapshot().lookups.miss_causes()
    assert causes["cold"] == 3 * BLOCK and causes["other"] == 0
    assert causes["not_cacheable"] == 2 * BLOCK  # each lookup's last block
    assert sum(causes.values()) == vllm_missed(driver)


def test_with_a_host_tier_the_causes_add_up_to_vllms_misses(tmp_path: Path):
    """Host hits are not misses; whatever misses, the causes sum to vLLM's figure."""
    driver = EngineDriver(build_scheduler(tmp_path, gpu_blocks=41, cpu_bytes=1 << 20))
    rec = Recorder(engine="vllm", model="test")
    instrument_scheduler(driver.scheduler, rec)
    for n in range(12):
        run_alone(driver, f"new{n}", prompt(n))
    for n in range(4):  # evicted from the GPU, still on the host
        run_alone(driver, f"back{n}", prompt(n))
    snap = rec.snapshot()
    causes = snap.lookups.miss_causes()
    assert driver.connector_hits > 0
    assert sum(causes.values()) == snap.lookups.miss == vllm_missed(driver)
    assert causes["cold"] == 12 * PROMPT_BLOCKS * BLOCK and causes["unknown"] == 0
