"""kvobs's thrash series in a real vLLM engine against an account of vLLM's own words.

kvobs classifies each block offloaded to the host tier by what happened during its stay
there: onloaded at least once (``kvobs_offloaded_reused_blocks_total``), evicted before any
onload (``kvobs_offloaded_evicted_unused_blocks_total``), onloaded within the thrash window
of its offload (``kvobs_thrash_onloads_total``), or forgotten for lack of room
(``kvobs_thrash_untracked_blocks_total``). This file rebuilds the same classification from
what vLLM itself says, without reading anything of kvobs's or vLLM's internals:

* **stays**: a CPU-medium ``BlockStored`` KV event opens a stay of each of its block
  hashes, a CPU ``BlockRemoved`` closes it (an eviction), ``AllBlocksCleared`` ends all;
* **loads**: vLLM loads, for a request it admits, the prompt blocks after its GPU prefix
  hit that its CPU manager holds, and counts them as external prefix-cache hits
  (``vllm:external_prefix_cache_hits``, in tokens). The driver read that counter after
  every step, with the requests that had no output yet and those that had their first in
  it, so each step's increase is given to the requests vLLM admitted in it (see
  ``loaded_requests``). A request's loaded blocks are its prompt blocks from
  ``GPU hit / BLOCK`` to ``cached / BLOCK`` (``num_cached_tokens`` = GPU hit + external
  hit; one host chunk is one GPU block here), named by vLLM's own block hashes, chained
  from its GPU ``BlockStored`` events (parent hash + tokens). vLLM names a host chunk in
  its events by the GPU block hash its offload key was made of, so the same hash names
  the block in both media: checked, not assumed (every host hash is a GPU one, and the
  probe's prompt, stored to the host and served from it again, is found under them).

A block can be stored to the host twice (evicted, then offloaded again: it happens in
this workload), so a load is placed in time (the driver's step bounds, the event batch
timestamps) and must fall in exactly one stay of its block. The count of loaded blocks is
held to vLLM's load bytes over the host chunk size, so the account cannot miss or invent
a load. Both executors are checked. The thrash window is kvobs's default (10 s): longer
than the whole multi-process run here, so there every load is an onload in the window;
the single-process run (a scrape after every step) takes 15-45 s on a small machine, and
its probe, served again after the flushes, may come back on either side of the window:
the onloads the two clocks cannot place within a second are allowed either way.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tests.engines.vllm032.conftest import EngineRun
from tests.engines.vllm032.engine_run import BLOCK, host_chunk_bytes

#: Seconds of slack when placing a load and an offload on one clock: kvobs stamps them
#: where vLLM calls its manager, the account with the driver's step bounds and the event
#: batch's timestamp (the engine core's wall clock, taken when the batch is published).
CLOCK_SLACK_S = 1.0

THRASH_SERIES = ("kvobs_offloaded_reused_blocks_total",
                 "kvobs_offloaded_evicted_unused_blocks_total",
                 "kvobs_thrash_onloads_total", "kvobs_thrash_untracked_blocks_total")


def kvobs_thrash_window_s() -> float:
    """The thrash window kvobs's vLLM plugin runs with: the recorder's default (the plugin
    passes none)."""
    from kvobs.recorder import Recorder

    window = inspect.signature(Recorder.__init__).parameters["thrash_window_s"].default
    assert isinstance(window, float)
    return window


@dataclass
class Stay:
    """One host block's stay in host memory, between the KV events that open and close it."""

    block_hash: int
    stored_ts: float
    removed_ts: float | None = None
    cleared: bool = False  # ended by AllBlocksCleared, not by an eviction
    loads: list[Load] = field(default_factory=list)

    def may_be_open(self, earliest: float, latest: float) -> bool:
        """Whether the stay can have been open at some time in ``[earliest, latest]``."""
        return self.stored_ts <= latest and (self.removed_ts is None or
                                             self.removed_ts >= earliest)


@dataclass(frozen=True)
class Load:
    """One host block vLLM loaded back for a request, during a time span the driver saw."""

    request: str
    block: int  # index in the request's prompt
    block_hash: int
    earliest: float
    latest: float


@dataclass
class HostAccount:
    """vLLM's own account of the host tier: every stay, and every block loaded back."""

    stays: list[Stay]
    loads: list[Load]
    requests_loaded: dict[str, int]  # request -> external-hit tokens

    @property
    def reused(self) -> int:
        return sum(1 for stay in self.stays if stay.loads)

    @property
    def evicted_unused(self) -> int:
        return sum(1 for stay in self.stays
                   if stay.removed_ts is not None and not stay.cleared and not stay.loads)


def gpu_block_hashes(events: Iterable[dict[str, Any]]) -> dict[tuple[Any, tuple[int, ...]], Any]:
    """``(parent hash, block tokens) -> hash`` from vLLM's GPU ``BlockStored`` events (one
    event may carry several chained blocks: each block's parent is the one before it)."""
    table: dict[tuple[Any, tuple[int, ...]], Any] = {}
    for event in events:
        if event["kind"] != "BlockStored" or event["medium"] != "GPU":
            continue
        parent, tokens = event["parent_block_hash"], event["token_ids"]
        assert len(tokens) == BLOCK * len(event["block_hashes"]), event
        for n, block_hash in enumerate(event["block_hashes"]):
            key = (parent, tuple(tokens[n * BLOCK:(n + 1) * BLOCK]))
            assert table.setdefault(key, block_hash) == block_hash, "one block, two hashes"
            parent = block_hash
    return table


def prompt_hashes(tokens: Sequence[int], table: dict[tuple[Any, tuple[int, ...]], Any],
                  blocks: int) -> list[Any]:
    """vLLM's hashes of the first ``blocks`` full blocks of a prompt, by its GPU events."""
    hashes: list[Any] = []
    parent = None
    for n in range(blocks):
        key = (parent, tuple(tokens[n * BLOCK:(n + 1) * BLOCK]))
        assert key in table, f"block {n} of a prompt was never stored on the GPU"
        parent = table[key]
        hashes.append(parent)
    return hashes


def check_event_stream(run: EngineRun) -> list[dict[str, Any]]:
    """The run's KV events, checked complete: none beyond the log's bound, and every batch
    the publisher numbered arrived, from its first (a missed batch would hide stays)."""
    events: list[dict[str, Any]] = run.account["kv_events"]
    assert run.account["kv_events_overflow"] == 0
    batches = sorted({event["seq"] for event in events})
    assert batches == list(range(len(batches)))
    tallies: dict[str, int] = {}
    for event in events:
        key = f"{event['kind']}/{event['medium']}"
        tallies[key] = tallies.get(key, 0) + (len(event["block_hashes"]) or 1)
    assert tallies == run.events  # the details are the events the other tests count
    return events


def loaded_requests(run: EngineRun) -> tuple[dict[str, int], dict[str, tuple[float, float]]]:
    """Per request with external hits: their tokens, and when vLLM admitted it (between the
    driver's submission, or the step's start single-process, and the end of the step after
    which the driver read the increase).

    Each increase of vLLM's counter over a step belongs to requests vLLM admitted in that
    step with host hits: ones without output before the step and none in it (vLLM loads
    host blocks asynchronously, so a request with host hits computes nothing in the step
    that admits it; its first output comes in a later step), each taking at most its
    cached tokens, once. A step with one such request left gives it the whole increase; a
    step whose requests' cached tokens sum to the increase gives each all of its own; each
    attribution narrows the other steps' choices, until every step is settled, or the
    split is ambiguous and the test says so.
    """
    cached = {r["id"]: r["cached"] for r in run.account["requests"]}
    unsettled: dict[int, tuple[int, dict[str, Any], list[str]]] = {}
    before = 0.0
    for n, step in enumerate(run.account["schedule"]):
        delta, before = int(step["external_hits"] - before), step["external_hits"]
        if delta:
            unsettled[n] = (delta, step, [r for r in step["waiting"]
                                          if r not in step["first"] and cached[r]])
    external: dict[str, int] = {}
    when: dict[str, tuple[float, float]] = {}
    progress = True
    while unsettled and progress:
        progress = False
        for n, (delta, step, candidates) in list(unsettled.items()):
            left = [r for r in candidates if r not in external]
            if len(left) == 1:
                split = {left[0]: delta}
            elif left and sum(cached[r] for r in left) == delta:
                split = {r: cached[r] for r in left}
            else:
                continue
            for request, tokens in split.items():
                assert 0 < tokens <= cached[request], (request, tokens)
                external[request] = tokens
                submitted = run.account["submitted"][request]
                earliest = step["began"] if run.mode == "single" else submitted
                when[request] = (max(earliest, submitted), step["ended"])
            del unsettled[n]
            progress = True
    assert not unsettled, f"external hits of steps {sorted(unsettled)}: ambiguous"
    assert sum(external.values()) == run.vllm.total("vllm:external_prefix_cache_hits_total")
    return external, when


def host_account(run: EngineRun) -> HostAccount:
    """Stays from vLLM's CPU events, loads from its per-step external hits and its hashes."""
    events = check_event_stream(run)
    table = gpu_block_hashes(events)
    gpu_hashes = set(table.values())
    stays: list[Stay] = []
    open_stays: dict[Any, Stay] = {}
    for event in events:
        if event["kind"] == "AllBlocksCleared":
            for stay in open_stays.values():
                stay.removed_ts, stay.cleared = event["ts"], True
            open_stays.clear()
        if event["medium"] != "CPU":
            continue
        for block_hash in event["block_hashes"]:
            if event["kind"] == "BlockStored":
                assert block_hash not in open_stays, "stored twice without a removal"
                assert block_hash in gpu_hashes, "a host block vLLM never named on the GPU"
                open_stays[block_hash] = Stay(block_hash, event["ts"])
                stays.append(open_stays[block_hash])
            elif event["kind"] == "BlockRemoved":
                open_stays.pop(block_hash).removed_ts = event["ts"]
    external, when = loaded_requests(run)
    loads: list[Load] = []
    for request_id, tokens in external.items():
        request = run.request(request_id)
        gpu_hit = request["cached"] - tokens
        assert gpu_hit % BLOCK == 0 and tokens % BLOCK == 0 and gpu_hit >= 0
        hashes = prompt_hashes(request["prompt_tokens"], table, request["cached"] // BLOCK)
        earliest, latest = when[request_id]
        for block in range(gpu_hit // BLOCK, request["cached"] // BLOCK):
            load = Load(request_id, block, hashes[block], earliest, latest)
            # the stay the load read: exactly one of the block's stays can be open then
            during = [s for s in stays if s.block_hash == load.block_hash
                      and s.may_be_open(earliest, latest)]
            assert len(during) == 1, f"{load}: {len(during)} stays may hold it"
            during[0].loads.append(load)
            loads.append(load)
    return HostAccount(stays, loads, external)


def thrash_truth(account: HostAccount, window_s: float) -> dict[str, tuple[int, int]]:
    """What kvobs's thrash series must read by vLLM's account, as ``(least, most)``: exact
    for the classification of stays; for onloads within the window, a load whose distance
    from its offload the two clocks cannot place on one side of the window (within
    ``CLOCK_SLACK_S`` of it) may count either way."""
    inside = undecided = 0
    for stay in account.stays:
        for load in stay.loads:
            if load.latest - stay.stored_ts + CLOCK_SLACK_S < window_s:
                inside += 1
            elif load.earliest - stay.stored_ts - CLOCK_SLACK_S <= window_s:
                undecided += 1
    return {"kvobs_offloaded_reused_blocks_total": (account.reused, account.reused),
            "kvobs_offloaded_evicted_unused_blocks_total": (account.evicted_unused,
                                                            account.evicted_unused),
            "kvobs_thrash_onloads_total": (inside, inside + undecided),
            "kvobs_thrash_untracked_blocks_total": (0, 0)}


def test_host_stays_and_loads_are_consistent_with_vllms_counters(engine: EngineRun) -> None:
    """The account itself: the host hashes are the GPU hashes of the same blocks (the
    probe's prompt, stored to the host and served from it again, is found under them), and
    its loaded blocks are the chunks vLLM's load bytes count."""
    account = host_account(engine)
    assert account.loads and account.reused and account.evicted_unused
    loaded = engine.vllm.total("vllm:kv_offload_load_bytes_total") / host_chunk_bytes()
    assert len(account.loads) == loaded
    repeat = engine.request("repeat")
    assert account.requests_loaded["repeat"] == engine.account["repeat_external_hits"] == \
        repeat["cached"]
    probe_loads = {load.block_hash for load in account.loads if load.request == "repeat"}
    assert len(probe_loads) == repeat["cached"] // BLOCK
    assert probe_loads <= {stay.block_hash for stay in account.stays}
    stored = sum(1 for e in engine.account["kv_events"]
                 if e["kind"] == "BlockStored" and e["medium"] == "CPU"
                 for _ in e["block_hashes"])
    assert len(account.stays) == stored


def test_thrash_series_are_vllms_host_stays_and_loads(engine: EngineRun) -> None:
    """Reused and evicted-unused offloads, onloads within the window and untracked blocks:
    kvobs's final scrape equals the classification of vLLM's own stays and loads."""
    account = host_account(engine)
    truth = thrash_truth(account, kvobs_thrash_window_s())
    got = {name: engine.kvobs.total(name) for name in THRASH_SERIES}
    wrong = [f"{name}: kvobs {got[name]:g}, vLLM {least}..{most}"
             for name, (least, most) in truth.items() if not least <= got[name] <= most]
    assert not wrong, wrong
