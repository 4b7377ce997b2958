"""The reuse profile inside SGLang 0.5.23's scheduler loop, against SGLang's own hit ratio.

Multi-turn chats whose every turn returns with its whole history, the previous answers
included (the pages SGLang's radix tree took at ``checkpoint`` when the answer finished,
which kvobs reports as ``written``), run through the real scheduler stack of
``scheduler_loop`` (``UnifiedRadixCache`` + HiCache write-through: a GPU pool and a host
pool twice its size that keeps a copy of every page the tree backs up).

SGLang's account, which kvobs does not compute: its hit ratio is its ``PrefillAdder``'s
``log_device_hit_tokens + log_host_hit_tokens`` over ``log_hit_tokens +
log_input_tokens``; its cache size is the distinct pages it holds on either medium, from
its own KV events (``BlockStored`` / ``BlockRemoved`` per medium): write-through keeps the
host a superset of the tree's device pages, so it never holds more than the host pool
(``max(gpu, host)``, inclusive). The profile is configured at that size, so the read is at
a bucket bound (exact at rate 1); it predicts page references, read in SGLang's unit,
tokens: hit pages x page size over looked-up tokens.
"""

from __future__ import annotations

import random
from collections.abc import Hashable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from kvobs.adapters.sglang import instrument_cache_controller, instrument_token_allocator
from kvobs.recorder import Recorder
from tests.engines.held_blocks import Media, spy_written
from tests.engines.sglang0523.scheduler_loop import Engine, install_stand_ins

PAGE = 16
DEVICE_TOKENS = 768               # 48 GPU pages; the host pool holds twice as many
REQUESTS = 150


@dataclass
class Held:
    """Distinct pages SGLang holds on any medium, from its KV events (after each step)."""

    media: Media = field(default_factory=Media)
    most: int = 0

    def read(self, engine: Engine) -> None:
        self.media.feed(engine.tree.take_events())
        self.most = max(self.most, len(self.media.where))


@dataclass
class Chat:
    """One run: SGLang's figures and what kvobs saw."""

    engine: Engine
    rec: Recorder
    held: Held
    written: list[Hashable]
    finished: list[Any]  # SGLang Req objects

    @property
    def host_pages(self) -> int:
        return int(self.engine.host_pool.size) // PAGE

    def measured(self) -> float:
        """SGLang's own hit ratio (its PrefillAdder's counts)."""
        engine = self.engine
        return (engine.device_hit_tokens + engine.host_hit_tokens) / engine.prompt_tokens

    def predicted(self) -> float:
        """The profile's hit ratio at SGLang's size, in tokens."""
        profile = self.rec.reuse
        assert profile is not None
        per_token = profile.references * PAGE / self.rec.snapshot().lookups.tokens
        return profile.hit_ratio(self.host_pages) * per_token


def chat(seed: int, *, report_written: bool = True, overlap: bool = False) -> Chat:
    """``REQUESTS`` turns of 12 conversations, one at a time; a turn picks its chat with
    Zipf popularity and its prompt is the chat's history (a 40-token system prompt,
    every user turn and every answer so far) plus a new user turn."""
    engine = Engine(tokens=DEVICE_TOKENS, page=PAGE, host_ratio=2.0, context=1024,
                    max_reqs=4, kv_events=True, overlap=overlap)
    rec = Recorder(engine="sglang")
    host_pages = int(engine.host_pool.size) // PAGE
    rec.add_tier("gpu", DEVICE_TOKENS // PAGE, PAGE, 0)
    rec.start_reuse_profile(capacity_blocks=host_pages)   # max(gpu, host): inclusive
    written = spy_written(rec, forward=report_written)
    assert instrument_token_allocator(engine.allocator, rec, tree_cache=engine.tree).active
    assert instrument_cache_controller(engine.controller, rec).active
    held = Held()
    rnd = random.Random(seed)
    system = [rnd.randrange(200, 1500) for _ in range(40)]
    histories = {c: list(system) for c in range(12)}
    weights = [1 / (c + 1) for c in range(12)]
    for _ in range(REQUESTS):
        c = rnd.choices(range(12), weights)[0]
        if len(histories[c]) > 500:     # the conversation ends; the user starts anew
            histories[c] = list(system)
        histories[c] += [rnd.randrange(200, 1500) for _ in range(rnd.randrange(5, 30))]
        request = engine.submit(histories[c], max_new_tokens=rnd.randrange(32, 96))
        for _ in range(1000):
            kind = engine.step()
            held.read(engine)
            if kind == "idle" and not engine.waiting:
                break
        else:
            raise AssertionError("the loop did not drain")
        histories[c] += list(request.output_ids)     # the answer SGLang generated
    return Chat(engine, rec, held, written, list(engine.finished))


@pytest.fixture(scope="module", params=[False, True], ids=["normal", "overlap"])
def run(request: pytest.FixtureRequest) -> Iterator[Chat]:
    """One seed-1 chat per scheduler loop (SGLang's normal one and its overlap loop),
    shared by the module (the stand-ins for its lifetime)."""
    patch = pytest.MonkeyPatch()
    install_stand_ins(patch)
    try:
        yield chat(seed=1, overlap=request.param)
    finally:
        patch.undo()


def test_sglang_is_inclusive_so_its_size_is_the_host_pool(run: Chat) -> None:
    """The size the profile is read at is SGLang's: its KV events never show more
    distinct pages than the host pool holds."""
    assert run.held.most <= run.host_pages
    assert run.held.most > DEVICE_TOKENS // PAGE     # the host adds pages the GPU dropped
    assert run.engine.host_hit_tokens > 0
    assert run.rec.snapshot().lookups.tokens == run.engine.prompt_tokens


def test_profile_predicts_sglangs_own_hit_ratio_at_its_size(run: Chat) -> None:
    """Off by -0.017 here (seed 1: 0.582 predicted, 0.600 measured); seeds 2-5 of the
    same workload measured -0.011, -0.007, -0.020, -0.009: SGLang evicts whole radix
    nodes (host eviction overshoots), so it is an LRU of its pages only to within about
    0.02."""
    profile = run.rec.reuse
    assert profile is not None and profile.rate == 1.0
    assert 0.3 < run.measured() < 0.95
    assert run.predicted() == pytest.approx(run.measured(), abs=0.03)


def test_written_pages_are_the_answers_pages_each_once(run: Chat) -> None:
    """What the tree keeps of a finished request past its lookup's pages: the full pages
    of every token with KV (all but the last output token), less the full pages of the
    prompt less its last token (SGLang's match never covers it)."""
    expected = sum(
        max((len(req.origin_input_ids) + len(req.output_ids) - 1) // PAGE
            - (len(req.origin_input_ids) - 1) // PAGE, 0)
        for req in run.finished)
    assert len(run.finished) == REQUESTS
    assert len(set(run.written)) == len(run.written) == expected


def test_lookups_alone_miss_the_answers_sglang_hits(stand_ins: None) -> None:
    """The mutant: no pages reported as written (the answers look cold next turn):
    0.072 below SGLang's own figure here (seeds 2, 3: 0.083, 0.091), against 0.017 with
    them."""
    dropped = chat(seed=1, report_written=False)
    assert dropped.measured() - dropped.predicted() > 0.05
