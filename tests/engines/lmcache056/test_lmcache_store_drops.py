"""Chunks a real LMCache 0.5.6 ``store`` drops under memory pressure: kvobs's gpu->host
drops equal LMCache's own account of what it did not store.

LMCache allocates a store's chunks one by one in its ``LocalCPUBackend``; an allocation
that finds no room and nothing to evict (every cached chunk pinned by a lookup) returns
None, and the store keeps only the chunks allocated before it. The truth is LMCache's:
its log line ``Stored X out of total Y tokens`` per store that copied something (``Y -
X`` tokens dropped), its warning that it chose to store only ``N`` chunks, and, for a
store that returns before copying anything (``N`` = 0, no ``Stored`` line), the tokens
its stats monitor registered for that store request and never finished. Tokens become
chunks at the engine's chunk size, a partial last chunk counting as one (the dropped
chunks are the call's last ones). Never kvobs's own formula over the same fields.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from kvobs.adapters.lmcache import instrument_lmcache_engine
from kvobs.recorder import Recorder
from kvobs.testing import Conformance
from tests.engines.lmcache056.lmcache_objects import (
    CHUNK,
    DIM,
    GPU_BLOCKS,
    HEADS,
    LAYERS,
    build_engine,
    destroy,
    destroy_all,
)

HOST = 8                    # chunks the CPU backend holds
INSTANCE = "kvobs-store-drops"
STORED = "Stored %d out of total %d tokens"
CUT_SHORT = "choosing to store only"


@pytest.fixture(scope="module", autouse=True)
def no_engine_outlives_the_module():
    yield
    destroy_all()


class LogCapture(logging.Handler):
    """LMCache's records from ``lmcache.v1.cache_engine`` (its own handler does not
    propagate), INFO and up while the test runs."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def lmcache_log() -> Iterator[LogCapture]:
    logger = logging.getLogger("lmcache.v1.cache_engine")
    capture, level = LogCapture(), logger.level
    logger.addHandler(capture)
    logger.setLevel(logging.INFO)
    yield capture
    logger.removeHandler(capture)
    logger.setLevel(level)


@dataclasses.dataclass
class StoreAccount:
    """One ``store`` call as LMCache accounts for it, and what kvobs counted."""

    name: str
    requested: int            # tokens LMCache was asked to store (its stats monitor)
    stored: int               # tokens it says it stored
    cut_short_at: int | None  # N of its "store only N chunks" warning, None: none
    kvobs_drops: int

    @property
    def lmcache_dropped_chunks(self) -> int:
        return -(-(self.requested - self.stored) // CHUNK)


class Driver:
    """Stores into the engine with the connector's keyword arguments, and reads LMCache's
    account of each call from its log records and its stats monitor."""

    def __init__(self, engine, rec: Recorder, log: LogCapture) -> None:
        self.engine, self.rec, self.log = engine, rec, log
        self.paged = torch.zeros(2, LAYERS, GPU_BLOCKS * CHUNK, HEADS, DIM,
                                 dtype=torch.float16)
        self.calls = 0

    def drops(self) -> int:
        return self.rec.snapshot().link("gpu", "host").drops

    def store(self, name: str, tokens: list[int] | None = None,
              mask: torch.Tensor | None = None, hashes: list[int] | None = None,
              offsets: list[int] | None = None) -> StoreAccount:
        """One ``store`` of ``tokens`` (or chunk ``hashes`` with their token counts
        ``offsets``), and LMCache's account of it."""
        monitor = self.engine.stats_monitor
        request_id = monitor.store_request_id
        self.log.records.clear()
        before = self.drops()
        n = len(tokens) if tokens is not None else sum(offsets or ())
        slots = list(range(n))      # a list: LMCache makes the tensor of a hashed store
        self.engine.store(tokens, hashes, offsets, mask, kvcaches=self.paged,
                          slot_mapping=torch.tensor(slots) if tokens is not None else slots,
                          offset=0, transfer_spec=None, request_configs=None,
                          req_id=f"{name}-{self.calls}")
        self.calls += 1
        stored_lines = [r.args for r in self.log.records if r.msg.startswith("[req_id=%s] "
                                                                              + STORED)]
        warnings = [r.args[0] for r in self.log.records if CUT_SHORT in str(r.msg)]
        request = monitor.store_requests.get(request_id)
        if stored_lines:            # it copied chunks: its line has both figures
            (_, stored, requested, *_), = stored_lines
        else:                       # nothing copied: the request it registered (if it
            stored = requested = 0  # did: unfinished), none when it skipped the store
            if request is not None:
                assert request.end_time == 0
                requested = request.num_tokens
        return StoreAccount(name, int(requested), int(stored),
                            int(warnings[0]) if warnings else None, self.drops() - before)


def fresh(n: int, first: int) -> list[int]:
    """``n`` tokens no other prompt of the test shares."""
    return list(range(first, first + n))


@contextlib.contextmanager
def instrumented(instance: str, **build: bool) -> Iterator[tuple[Any, Recorder, Any]]:
    """An engine with a CPU backend of ``HOST`` slots, instrumented as a server does (before
    its ``post_init``); destroyed after."""
    engine = build_engine(host_chunks=HOST, instance=instance, **build)
    rec = Recorder(engine="lmcache", model="tiny-llama")
    inst = instrument_lmcache_engine(engine, rec)
    engine.post_init()
    try:
        yield engine, rec, inst
    finally:
        inst.unwrap()
        destroy(instance)


@pytest.fixture
def pressed(lmcache_log):
    with instrumented(INSTANCE, save_unfull_chunk=True) as (engine, rec, inst):
        assert inst.active and inst.backend is not None and inst.copies_seen
        yield engine, rec, inst, Driver(engine, rec, lmcache_log)


def test_drops_equal_the_chunks_lmcache_did_not_store(pressed):
    engine, rec, _, d = pressed
    budget = engine.storage_manager.local_cpu_backend.calculate_chunk_budget()
    assert budget == HOST
    kit = Conformance(rec)
    a = fresh(5 * CHUNK, 1000)                          # 5 chunks, room for 8
    calm = d.store("calm", a)
    kit.check("calm")
    # LMCache's own lookup pins the 5 chunks: they cannot be evicted
    assert engine.lookup(tokens=a, lookup_id="pin-a", pin=True) == 5 * CHUNK

    b = fresh(6 * CHUNK + 4, 2000)                     # 7 chunks (the last partial), room for 3
    partial = d.store("partial", b)
    kit.check("partial")
    assert engine.lookup(tokens=b, lookup_id="pin-b", pin=True) == 3 * CHUNK  # all pinned

    c = fresh(2 * CHUNK + 8, 3000)                     # 3 chunks, room for none
    early = d.store("early", c)
    kit.check("early")
    # the connector's masked store: a prompt whose first 5 chunks are a's (cached)
    masked_tokens = a + fresh(3 * CHUNK, 4000)
    mask = torch.ones(len(masked_tokens), dtype=torch.bool)
    mask[:5 * CHUNK] = False
    masked = d.store("masked", masked_tokens, mask=mask)
    kit.check("masked")
    # chunk hashes with their token counts (an empty one LMCache skips): 3 chunks
    hashed = d.store("hashed", hashes=[71, 72, 73, 74], offsets=[CHUNK, 0, CHUNK, 5])
    kit.check("hashed")
    engine.freeze(True)                                 # LMCache skips the store itself
    frozen = d.store("frozen", fresh(2 * CHUNK, 5000))   # (registers no request)
    engine.freeze(False)
    engine.lookup_unpin("pin-a")
    engine.lookup_unpin("pin-b")
    evicting = d.store("evicting", fresh(4 * CHUNK, 6000))  # full but evictable: no drop
    kit.check("evicting")

    accounts = [calm, partial, early, masked, hashed, frozen, evicting]
    # LMCache's figures, call by call
    assert [(s.requested, s.stored, s.cut_short_at) for s in accounts] == [
        (80, 80, None), (100, 48, 3), (40, 0, 0), (48, 0, 0), (37, 0, 0), (0, 0, None),
        (64, 64, None)]
    assert [s.lmcache_dropped_chunks for s in accounts] == [0, 4, 3, 3, 3, 0, 0]
    # kvobs: one drop per chunk LMCache did not store, none where it stored or skipped
    for s in accounts:
        assert s.kvobs_drops == s.lmcache_dropped_chunks, s
    link = rec.snapshot().link("gpu", "host")
    assert link.drops == sum(s.lmcache_dropped_chunks for s in accounts) == 13
    # the chunks it did store were copied: 5 + 3 + 4
    assert link.blocks == sum(-(-s.stored // CHUNK) for s in accounts) == 12


def test_refusals_outside_the_store_count_no_drop(pressed):
    """A refusal in another thread while a store copies, and an older one in the storing
    thread outside any store, drop nothing of a store that LMCache stored in full; a later
    store cut short in that thread still counts its own chunks."""
    engine, rec, inst, d = pressed
    backend = engine.storage_manager.local_cpu_backend
    kit = Conformance(rec)

    def allocate() -> object:
        return backend.allocate(engine.metadata.get_shapes(CHUNK), engine.metadata.get_dtypes(),
                                busy_loop=False)

    a = fresh(5 * CHUNK, 1000)
    d.store("a", a)
    assert engine.lookup(tokens=a, lookup_id="pin-a", pin=True) == 5 * CHUNK

    refused_elsewhere: list[object] = []

    def refuse_in_another_thread() -> None:     # the pool: 5 pinned + the store's 3
        worker = threading.Thread(target=lambda: refused_elsewhere.append(allocate()))
        worker.start()
        worker.join()

    engine.gpu_connector.during_copy = refuse_in_another_thread
    x = d.store("x", fresh(3 * CHUNK, 2000))
    engine.gpu_connector.during_copy = None
    kit.check("x")
    assert refused_elsewhere == [None] and inst.backend.refusals == 1

    held = [allocate() for _ in range(4)]        # evicts x's 3 chunks, then refused here
    assert held[3] is None and inst.backend.refusals == 2
    for obj in held[:3]:
        obj.ref_count_down()
    kit.check("refused outside a store")
    y = fresh(3 * CHUNK, 3000)
    whole = d.store("y", y)                      # room again: stored in full
    assert engine.lookup(tokens=y, lookup_id="pin-y", pin=True) == 3 * CHUNK
    z = d.store("z", fresh(2 * CHUNK, 4000))     # everything pinned: nothing stored
    kit.check("z")
    engine.lookup_unpin("pin-a")
    engine.lookup_unpin("pin-y")

    assert [(s.requested, s.stored, s.cut_short_at) for s in (x, whole, z)] == [
        (48, 48, None), (48, 48, None), (32, 0, 0)]
    assert [s.kvobs_drops for s in (x, whole, z)] == [0, 0, 2] == \
        [s.lmcache_dropped_chunks for s in (x, whole, z)]


@dataclasses.dataclass
class LayerStoreAccount:
    """One layerwise ``store_layer`` call as LMCache accounts for it, and kvobs's drops."""

    name: str
    held: int                 # tokens asked to be stored that LMCache held before (the
                              # prefix its lookup found, less the mask's False prefix)
    requested: int            # tokens it was asked to store (its stats monitor)
    stored: int               # tokens it stored (the same request, finished)
    kvobs_drops: int          # objects: a chunk is one per layer

    @property
    def lmcache_dropped_chunks(self) -> int:
        return -(-(self.requested - self.held - self.stored) // CHUNK)


@pytest.fixture
def layers_pressed():
    with instrumented(f"{INSTANCE}-layerwise", layerwise=True) as (engine, rec, inst):
        assert inst.active and inst.backend is not None and inst.layer_drops
        yield engine, rec


def test_layerwise_drops_equal_the_chunks_lmcache_did_not_store(layers_pressed):
    """``use_layerwise``: ``store_layer`` allocates each chunk's layers together
    (``batched_allocate``) in its first step, skips the chunks it holds and stops at the
    first allocation refused. kvobs counts, per call, every layer object of the chunks
    LMCache neither held nor stored: against LMCache's account (the tokens its monitor
    registered for the store and those it finished with, less the prefix its own lookup
    said it held before the call); the conformance kit checks after every call."""
    engine, rec = layers_pressed
    monitor = engine.stats_monitor
    paged = torch.zeros(2, LAYERS, GPU_BLOCKS * CHUNK, HEADS, DIM, dtype=torch.float16)
    kit = Conformance(rec)
    # every object (one layer of a chunk, rounded up to LMCache's 4 KiB) takes a 4 KiB slot
    assert engine.storage_manager.local_cpu_backend.calculate_chunk_budget() == HOST

    def store(name: str, tokens: list[int], mask: torch.Tensor | None = None
              ) -> LayerStoreAccount:
        unmasked = 0 if mask is None else int((~mask).sum())
        held = max(engine.lookup(tokens=tokens, lookup_id=f"probe-{name}") - unmasked, 0)
        request_id, asked = monitor.store_request_id, monitor.interval_stored_tokens
        before = rec.snapshot().link("gpu", "host").drops
        for _ in engine.store_layer(tokens, mask, kvcaches=paged, sync=False,
                                    slot_mapping=torch.arange(len(tokens)),
                                    req_id=name):
            pass             # a layer copied is put one step later: check between calls
        kit.check(name)
        request = monitor.store_requests[request_id]
        return LayerStoreAccount(name, held, monitor.interval_stored_tokens - asked,
                                 request.num_tokens,
                                 rec.snapshot().link("gpu", "host").drops - before)

    a = fresh(2 * CHUNK, 1000)                       # 2 chunks = 4 objects, room for 8
    calm = store("calm", a)
    assert engine.lookup(tokens=a, lookup_id="pin-a", pin=True) == 2 * CHUNK
    b = fresh(3 * CHUNK, 2000)                       # 3 chunks, room for 2
    partial = store("partial", b)
    assert engine.lookup(tokens=b, lookup_id="pin-b", pin=True) == 2 * CHUNK  # all pinned
    again = store("again", b)                        # its 2 held chunks skipped, 1 refused
    early = store("early", fresh(2 * CHUNK, 3000))   # room for none
    masked_tokens = a + fresh(CHUNK, 4000)           # the connector's mask: a is stored
    mask = torch.ones(len(masked_tokens), dtype=torch.bool)
    mask[:2 * CHUNK] = False
    masked = store("masked", masked_tokens, mask)
    engine.lookup_unpin("pin-a")
    engine.lookup_unpin("pin-b")
    evicting = store("evicting", fresh(3 * CHUNK, 5000))   # full but evictable: no drop

    accounts = [calm, partial, again, early, masked, evicting]
    # LMCache's figures, call by call: (held, requested, stored) tokens
    assert [(s.held, s.requested, s.stored) for s in accounts] == [
        (0, 32, 32), (0, 48, 32), (32, 48, 0), (0, 32, 0), (0, 16, 0), (0, 48, 48)]
    assert [s.lmcache_dropped_chunks for s in accounts] == [0, 1, 1, 2, 1, 0]
    for s in accounts:       # every layer of each chunk LMCache did not store
        assert s.kvobs_drops == s.lmcache_dropped_chunks * LAYERS, s
    link = rec.snapshot().link("gpu", "host")
    assert link.drops == 5 * LAYERS
    assert link.blocks == (2 + 2 + 3) * LAYERS      # the chunks it stored, every layer copied
    assert rec.snapshot().errors == {}


def test_layerwise_drops_leave_out_the_chunks_lmcache_holds_past_the_refused_one(
        layers_pressed):
    """A ``store_layer`` refused room at its first chunk, whose second chunk LMCache still
    holds (the first was evicted, least recently used; the second is pinned): LMCache
    stops at the refused chunk and keeps the held one, so only the refused chunk is
    dropped. The truth is LMCache's: the tokens its monitor registered and finished for
    the call, less those of the call's chunks its storage manager says it holds."""
    engine, rec = layers_pressed
    monitor, manager = engine.stats_monitor, engine.storage_manager
    backend = manager.local_cpu_backend
    paged = torch.zeros(2, LAYERS, GPU_BLOCKS * CHUNK, HEADS, DIM, dtype=torch.float16)
    kit = Conformance(rec)

    def store(name: str, tokens: list[int]) -> None:
        for _ in engine.store_layer(tokens, None, kvcaches=paged, sync=False,
                                    slot_mapping=torch.arange(len(tokens)), req_id=name):
            pass
        kit.check(name)

    def chunks(tokens: list[int]) -> list[tuple[int, int, list[Any]]]:
        return [(start, end, key.split_layers(LAYERS))
                for start, end, key in engine.token_database.process_tokens(tokens=tokens)]

    def held(layer_keys: list[Any]) -> bool:
        return manager.contains(layer_keys[0], engine.retrieve_locations) is not None

    p, q, r = fresh(2 * CHUNK, 1000), fresh(2 * CHUNK, 2000), fresh(CHUNK, 3000)
    store("p", p)
    store("q", q)                                    # the buffer is full (4 chunks)
    store("r", r)                                    # evicts p's first chunk, the oldest
    (_, _, first), (_, _, second) = chunks(p)
    assert not held(first) and held(second)
    assert engine.lookup(tokens=q, lookup_id="pin-q", pin=True) == 2 * CHUNK
    assert engine.lookup(tokens=r, lookup_id="pin-r", pin=True) == CHUNK
    assert all(backend.pin(key) for key in second)   # nothing evictable is left

    holds = sum(end - start for start, end, keys in chunks(p) if held(keys))
    request_id, asked = monitor.store_request_id, monitor.interval_stored_tokens
    before = rec.snapshot().link("gpu", "host").drops
    store("again", p)
    requested = monitor.interval_stored_tokens - asked
    stored = monitor.store_requests[request_id].num_tokens
    assert (requested, holds, stored) == (2 * CHUNK, CHUNK, 0)
    lmcache_dropped = -(-(requested - holds - stored) // CHUNK)
    assert rec.snapshot().link("gpu", "host").drops - before == lmcache_dropped * LAYERS \
        == 1 * LAYERS
    assert held(second)                              # LMCache kept it
    for key in second:
        backend.unpin(key)
    engine.lookup_unpin("pin-q")
    engine.lookup_unpin("pin-r")
