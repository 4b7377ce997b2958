"""The reuse profile inside a real vLLM 0.33 scheduler loop, against vLLM's own hit rate.

Multi-turn chats whose every turn returns with its whole history, the previous answers
included (the answers are what vLLM wrote during decode and cached; kvobs reports them
when the request releases its blocks), run through a real ``Scheduler`` with the real
``OffloadingConnector`` (a GPU pool and a host tier that keeps copies of GPU blocks:
mostly inclusive). The engine's own cache size is the distinct blocks it holds, GPU and
host together, as its KV cache events say (``BlockStored`` / ``BlockRemoved`` per
medium), averaged over the steps after the first third: the host keeps copies of GPU
blocks, but its LRU order is not the GPU's, so the union is more than either tier and less
than both. vLLM measures its own hit rate: ``PrefixCacheStats`` (GPU hits over queried
tokens) plus the connector's prefix-cache stats (host hits). The profile predicts block
references; a prompt's partial last block can never hit in vLLM, so the prediction is
read in vLLM's unit, tokens: predicted hit blocks x block size over looked-up tokens.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from kvobs.adapters.vllm import instrument_scheduler
from kvobs.adapters.vllm.lookups import LookupInstrumentation
from kvobs.recorder import Recorder
from tests.engines.held_blocks import Media
from tests.engines.vllm.vllm_engine import EngineDriver, build_scheduler

CHUNK_BYTES = 16384  # one GPU block of the test model = one host chunk
GPU_BLOCKS, HOST_CHUNKS = 48, 96
REQUESTS = 150


class Held:
    """Distinct blocks vLLM holds on any medium, after each step, from its KV events."""

    def __init__(self, driver: EngineDriver) -> None:
        self.driver = driver
        self.seen = 0
        self.media = Media()
        self.sizes: list[int] = []

    def step(self) -> None:
        self.driver.step()
        events = self.driver.kv_events
        self.media.feed(events[self.seen:], default_medium="GPU")
        self.seen = len(events)
        self.sizes.append(len(self.media.where))

    def steady(self) -> float:
        tail = self.sizes[len(self.sizes) // 3:]
        return sum(tail) / len(tail)


def chat(driver: EngineDriver, held: Held, *, chats: int, requests: int, seed: int) -> None:
    """``requests`` turns of ``chats`` conversations, one at a time; a turn picks its chat
    with Zipf popularity (some users come back often) and its prompt is the chat's
    history (system prompt, every user turn and every answer so far) plus a new user turn."""
    rnd = random.Random(seed)
    system = [rnd.randrange(1000) for _ in range(40)]
    histories = {c: list(system) for c in range(chats)}
    weights = [1 / (c + 1) for c in range(chats)]
    for turn in range(requests):
        c = rnd.choices(range(chats), weights)[0]
        if len(histories[c]) > 560:  # the conversation ends; the user starts a new one
            histories[c] = list(system)
        histories[c] += [rnd.randrange(1000) for _ in range(rnd.randrange(5, 30))]
        request = driver.add(f"chat{c}-turn{turn}", histories[c],
                             max_tokens=rnd.randrange(32, 96))
        while driver.busy:
            held.step()
        histories[c] += list(request.output_token_ids)  # the answer vLLM generated


def run(tmp_path: Path, rec: Recorder, written: bool = True) -> tuple[float, float, float]:
    """``(vLLM's measured hit ratio, predicted hit ratio in tokens, effective size)``;
    ``written=False`` is the mutant whose releases report no decode-written blocks."""
    driver = EngineDriver(build_scheduler(tmp_path, gpu_blocks=GPU_BLOCKS,
                                          cpu_bytes=HOST_CHUNKS * CHUNK_BYTES),
                          transfer_delay=1)
    inst = instrument_scheduler(driver.scheduler, rec)
    assert inst.active
    lookups = next(part for part in inst.parts if part.component == "vllm.kv_cache_manager")
    assert isinstance(lookups, LookupInstrumentation) and lookups.writes
    if not written:
        lookups.writes = False  # the release wrappers' gate, in C and in Python
    held = Held(driver)
    chat(driver, held, chats=12, requests=REQUESTS, seed=1)
    # the profile's configured size: vLLM's tiers are inclusive (the host keeps copies of
    # GPU blocks), so the larger of GPU (its null block left out) and host (chunks of one
    # block), as vLLM's own configuration gives them; the distinct blocks the engine
    # really holds (``effective``) lie between that and their sum
    info = dict(driver.connector_scheduler.manager.config_info()[0])
    gpu, host = driver.scheduler.kv_cache_config.num_blocks - 1, int(info["cpu_num_chunks"])
    assert rec.reuse is not None and rec.reuse.capacity_blocks == max(gpu, host)
    inst.unwrap()
    assert driver.preempted_queries == 0  # every lookup is in vLLM's hit rate
    measured = (driver.prefix_hits + driver.connector_hits) / driver.prefix_queries
    profile, lookups = rec.reuse, rec.snapshot().lookups
    assert profile is not None and lookups.tokens == driver.prefix_queries
    effective = held.steady()
    assert max(gpu, host) <= effective <= gpu + host
    per_token = profile.references * driver.block_size / lookups.tokens
    return measured, profile.hit_ratio(effective) * per_token, effective


def test_profile_predicts_vllms_own_hit_rate_at_the_engines_size(tmp_path: Path) -> None:
    """Off by -0.013 here (seed 1); seeds 2 and 3 of the same workload measured -0.024 and
    +0.029: vLLM's two tiers keep two LRU orders (GPU hits do not refresh the host's), so
    the engine is an LRU of its distinct blocks only to within about 0.03."""
    rec = Recorder(engine="vllm", model="test")
    measured, predicted, effective = run(tmp_path, rec)
    assert effective > GPU_BLOCKS  # the host tier adds blocks the GPU no longer holds
    profile = rec.reuse
    assert profile is not None and profile.rate == 1.0
    assert 0.3 < measured < 0.95
    assert predicted == pytest.approx(measured, abs=0.03)
    per_token = profile.references * 16 / rec.snapshot().lookups.tokens
    assert profile.hit_ratio(profile.bounds[-1]) * per_token >= measured  # never below


def test_lookups_alone_miss_the_answers_vllm_hits(tmp_path: Path) -> None:
    """The mutant: no blocks reported as written (the answers look cold next turn)."""
    rec = Recorder(engine="vllm", model="test")
    measured, predicted, _ = run(tmp_path, rec, written=False)
    assert measured - predicted > 0.03
