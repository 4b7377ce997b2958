"""The GPU tier of a real vLLM 0.33 KVCacheManager/BlockPool: kvobs equals vLLM's own numbers."""

from __future__ import annotations

import random

import pytest
from structlog.testing import capture_logs
from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved
from vllm.v1.core.block_pool import BlockPool

from kvobs.adapters import AdapterError
from kvobs.adapters.vllm import instrument_block_pool, instrument_kv_cache_manager
from kvobs.recorder import Recorder
from tests.engines.vllm.vllm_objects import admit, kv_cache_manager, page_bytes, request


def engine_view(pool: BlockPool) -> tuple[int, int]:
    """(in use, cached) as vLLM's own structures say: ref counts and prefix hashes."""
    blocks = [b for b in pool.blocks if not b.is_null]
    in_use = sum(1 for b in blocks if b.ref_cnt > 0)
    cached = sum(1 for b in blocks if b.ref_cnt == 0 and b.block_hash is not None)
    return in_use, cached


def assert_matches_engine(rec: Recorder, pool: BlockPool) -> None:
    tier = rec.snapshot().tier("gpu")
    assert tier.capacity_blocks == pool.num_gpu_blocks - 1
    assert (tier.in_use_blocks, tier.cached_blocks) == engine_view(pool)
    assert tier.free_blocks + tier.cached_blocks == pool.get_num_free_blocks()
    assert tier.in_use_blocks / tier.capacity_blocks == pytest.approx(pool.get_usage())
    # Flow identities: every block that entered use left it or is still there.
    assert tier.allocations + tier.reuses - tier.frees == tier.in_use_blocks


def chat_workload(manager, rec, turns: int, seed: int = 0) -> int:
    """Multi-turn chats sharing a system prompt; returns evicted hashes seen in events."""
    rnd = random.Random(seed)
    system = [rnd.randrange(32000) for _ in range(48)]
    histories = {c: list(system) for c in range(4)}
    running, removed = [], 0
    for _ in range(turns):
        chat = rnd.randrange(4)
        if len(histories[chat]) > 240:   # the chat ends; a new one starts
            histories[chat] = list(system)
        histories[chat] += [rnd.randrange(32000) for _ in range(rnd.randrange(8, 40))]
        req = request(list(histories[chat]))
        while admit(manager, req) is None:   # out of blocks: finish the oldest, retry
            manager.free(running.pop(0))
        running.append(req)
        if len(running) > 2:
            manager.free(running.pop(0))
        removed += sum(len(e.block_hashes) for e in manager.take_events()
                       if isinstance(e, BlockRemoved))
        assert_matches_engine(rec, manager.block_pool)
    return removed


def test_chat_workload_counts_equal_vllm_stats_and_events():
    manager = kv_cache_manager(40)
    manager.enable_kv_cache_events = manager.block_pool.enable_kv_cache_events = True
    rec = Recorder(engine="vllm", model="test")
    inst = instrument_kv_cache_manager(manager, rec)
    assert inst.active

    removed = chat_workload(manager, rec, turns=60)

    snap = rec.snapshot()
    gpu = snap.tier("gpu")
    stats = manager.make_prefix_cache_stats()
    assert stats.preempted_requests == 0  # preemption: see test_vllm_real_loop
    assert snap.lookups.lookups == stats.requests == 60
    assert snap.lookups.tokens == stats.queries
    assert snap.lookups.gpu_hit == stats.hits > 0
    assert gpu.reuses > 0, "the workload must hit cached blocks"
    assert gpu.evictions["capacity"] == removed > 0, "pool pressure must evict cached blocks"
    assert gpu.block_tokens == 16 and gpu.block_bytes == 4 * page_bytes()
    assert snap.errors == {}


def test_out_of_blocks_error_passes_through_and_counts_nothing():
    pool = BlockPool(num_gpu_blocks=9, enable_caching=True, hash_block_size=16)
    rec = Recorder()
    instrument_block_pool(pool, rec)
    held = pool.get_new_blocks(8)
    with pytest.raises(ValueError, match="Cannot get 1 free blocks"):
        pool.get_new_blocks(1)
    assert rec.snapshot().tier("gpu").allocations == 8
    pool.free_blocks(held)
    assert_matches_engine(rec, pool)


def test_explicit_eviction_and_reset_are_counted_by_reason():
    manager = kv_cache_manager(30)
    rec = Recorder()
    instrument_kv_cache_manager(manager, rec)
    reqs = [request(list(range(i * 100, i * 100 + 64))) for i in range(3)]
    for req in reqs:
        admit(manager, req)
    for req in reqs:
        manager.free(req)
    cached_ids = {b.block_id for b in manager.block_pool.blocks if b.block_hash is not None}
    victims = set(sorted(cached_ids)[:3])
    manager.evict_blocks(victims)
    assert rec.snapshot().tier("gpu").evictions["explicit"] == 3
    assert_matches_engine(rec, manager.block_pool)

    left = engine_view(manager.block_pool)[1]
    manager.block_pool.enable_kv_cache_events = True
    assert manager.reset_prefix_cache()
    assert any(isinstance(e, AllBlocksCleared) for e in manager.block_pool.take_events())
    gpu = rec.snapshot().tier("gpu")
    assert gpu.evictions["reset"] == left > 0
    assert gpu.cached_blocks == 0
    assert_matches_engine(rec, manager.block_pool)


def test_a_hit_evicted_before_it_is_touched_is_a_plain_allocation():
    """A prefix hit whose block lost its data between the lookup and ``touch`` (another
    allocation evicted it, or an explicit eviction): vLLM takes the empty block into use,
    which kvobs counts as an allocation, not a reuse; vLLM's own counts agree."""
    manager = kv_cache_manager(30)
    rec = Recorder()
    instrument_kv_cache_manager(manager, rec)
    first = request(list(range(64)))
    admit(manager, first)
    manager.free(first)
    pool = manager.block_pool
    hits = [b for b in pool.blocks if b.block_hash is not None and not b.is_null]
    assert len(hits) == 4
    manager.evict_blocks({b.block_id for b in hits[:2]})  # lose their data first
    pool.touch(hits)                                      # then the hit takes them
    gpu = rec.snapshot().tier("gpu")
    assert (gpu.reuses, gpu.allocations - 4) == (2, 2)    # 4 blocks of the first request
    assert_matches_engine(rec, pool)
    pool.free_blocks(hits)
    assert_matches_engine(rec, pool)


def test_prefix_caching_off_counts_plain_allocations():
    manager = kv_cache_manager(20, caching=False)
    rec = Recorder()
    instrument_kv_cache_manager(manager, rec)
    req = request(list(range(70)))
    admit(manager, req)
    manager.free(req)
    gpu = rec.snapshot().tier("gpu")
    assert (gpu.allocations, gpu.frees, gpu.cached_blocks, gpu.reuses) == (5, 5, 0, 0)
    assert rec.snapshot().lookups.tokens == 0, "no lookup happens without prefix caching"


def test_unwrap_restores_the_pool_exactly_and_twice_is_a_no_op():
    pool = BlockPool(num_gpu_blocks=9, enable_caching=True, hash_block_size=16)
    before = dict(vars(pool))
    inst = instrument_block_pool(pool, Recorder())
    assert "get_new_blocks" in vars(pool)
    inst.unwrap()
    inst.unwrap()
    assert vars(pool) == before
    assert pool.get_new_blocks.__func__ is BlockPool.get_new_blocks
    instrument_block_pool(pool, Recorder()).unwrap()  # wrapping again after unwrap works


def test_wrapping_twice_or_the_wrong_object_is_a_clear_error():
    pool = BlockPool(num_gpu_blocks=9, enable_caching=True, hash_block_size=16)
    instrument_block_pool(pool, Recorder())
    with pytest.raises(AdapterError, match="already instrumented"):
        instrument_block_pool(pool, Recorder())
    with pytest.raises(AdapterError, match=r"BlockPool, got builtins\.dict"):
        instrument_block_pool({}, Recorder())


def test_unknown_vllm_version_warns_once_and_wraps_nothing():
    class FutureBlockPool(BlockPool):  # a vLLM whose allocator signature changed
        def get_new_blocks(self, count, *, group=0):
            return super().get_new_blocks(count)

    rec = Recorder()
    with capture_logs() as logs:
        pools = [FutureBlockPool(9, True, 16) for _ in range(2)]
        insts = [instrument_block_pool(pool, rec) for pool in pools]
    assert [inst.active for inst in insts] == [False, False]
    assert rec.tier_names == (), "an uninstrumented pool exports no half-true tier"
    assert all("get_new_blocks" not in vars(pool) for pool in pools)
    warnings = [e for e in logs if e["event"] == "kvobs_adapter_unsupported_version"]
    assert len(warnings) == 1 and "get_new_blocks(count, group)" in warnings[0]["problems"][0]


def test_bookkeeping_failure_is_counted_and_the_engine_result_returned():
    pool = BlockPool(num_gpu_blocks=9, enable_caching=True, hash_block_size=16)
    rec = Recorder()
    instrument_block_pool(pool, rec)
    blocks = pool.get_new_blocks(2)
    pool.free_blocks(blocks)
    # A block list kvobs cannot inspect: vLLM handles it, kvobs counts its own failure.
    class Opaque(list):
        def __iter__(self):
            if not getattr(self, "seen", False):
                self.seen = True
                raise RuntimeError("kvobs cannot read this")
            return super().__iter__()
    pool.touch(Opaque(blocks))
    assert all(b.ref_cnt == 1 for b in blocks), "the engine call ran"
    assert rec.snapshot().errors == {"vllm.block_pool": 1}


def test_snapshots_taken_while_the_engine_runs_never_go_backwards():
    import itertools
    import threading

    manager = kv_cache_manager(40)
    rec = Recorder()
    instrument_kv_cache_manager(manager, rec)
    done = threading.Event()
    seen = []

    def scrape() -> None:
        while not done.is_set():
            gpu = rec.snapshot().tier("gpu")
            seen.append((gpu.allocations, gpu.frees, gpu.reuses, gpu.evictions_total))

    scraper = threading.Thread(target=scrape)
    scraper.start()
    try:
        rnd = random.Random(1)
        prompts = [[rnd.randrange(32000) for _ in range(48)] for _ in range(6)]
        running = []
        for _ in range(300):
            tail = [rnd.randrange(32000) for _ in range(rnd.randrange(8, 80))]
            req = request(prompts[rnd.randrange(6)] + tail)
            while admit(manager, req) is None:
                manager.free(running.pop(0))
            running.append(req)
            if len(running) > 3:
                manager.free(running.pop(0))
    finally:
        done.set()
        scraper.join()
    assert len(seen) > 10
    assert seen[-1][2] > 0 and seen[-1][3] > 0, "reuses and evictions happened"
    for earlier, later in itertools.pairwise(seen):
        assert all(b >= a for a, b in zip(earlier, later, strict=True)), (earlier, later)
    assert_matches_engine(rec, manager.block_pool)


def test_a_scrape_interrupted_between_its_walk_and_its_sums_reads_nothing_high():
    """The engine moves after a scrape walked the pool but before it derived the frees
    (a thread switch there): the derivation must use the tallies read with the walk,
    or the new allocation counts against the old walk as a free that never happened."""
    manager = kv_cache_manager(40)
    rec = Recorder()
    instrument_kv_cache_manager(manager, rec)
    pool = manager.block_pool
    admit(manager, request(list(range(64))))
    real_null = pool.null_block

    class EngineMovesAfterTheWalk:
        """The pool's null block, whose ``ref_cnt`` (read right after the walk) lets the
        engine admit one more request first, once."""

        fired = False

        def __getattr__(self, name: str) -> object:
            return getattr(real_null, name)

        @property
        def ref_cnt(self) -> int:
            if not self.fired:
                self.fired = True
                admit(manager, request(list(range(1000, 1064))))
            return int(real_null.ref_cnt)

    interrupted = EngineMovesAfterTheWalk()
    pool.null_block = interrupted
    try:
        rec.snapshot()
    finally:
        pool.null_block = real_null
    assert interrupted.fired
    assert_matches_engine(rec, pool)


def test_a_partial_block_promoted_to_full_is_one_cached_block():
    """vLLM's partial prefix entries: a block hashed partially, then promoted to full by
    ``cache_full_blocks``, is one hashed block; when pool pressure repurposes it and its
    neighbour, kvobs counts the capacity evictions vLLM's BlockRemoved events report."""
    pool = BlockPool(num_gpu_blocks=9, enable_caching=True, hash_block_size=16,
                     enable_kv_cache_events=True)
    rec = Recorder(engine="vllm", model="test")
    instrument_block_pool(pool, rec, block_tokens=32)
    req = request(list(range(2, 66)))  # 64 tokens: four 16-token hashes, two 32-token blocks
    blocks = pool.get_new_blocks(2)
    pool.cache_partial_block(req, blocks[0], num_tokens=16, kv_cache_group_id=0,
                             block_size=32)
    pool.cache_full_blocks(req, blocks, num_cached_blocks=0, num_full_blocks=2,
                           block_size=32, kv_cache_group_id=0)  # promotes blocks[0]
    pool.free_blocks(blocks)
    pool.take_events()
    assert rec.snapshot().tier("gpu").cached_blocks == 2
    pool.free_blocks(pool.get_new_blocks(8))  # every block: both cached ones repurposed
    removed = sum(len(e.block_hashes) for e in pool.take_events()
                  if isinstance(e, BlockRemoved))
    gpu = rec.snapshot().tier("gpu")
    assert gpu.evictions["capacity"] == removed == 2
    assert gpu.cached_blocks == 0 and rec.snapshot().errors == {}


def oracle_walk(blocks) -> tuple[int, int, int]:
    """The walk's meaning, block by block through vLLM's public ``block_hash``:
    ``(hashed, in_use, cached)``."""
    hashed = [b for b in blocks if b.block_hash is not None]
    return (len(hashed), sum(1 for b in blocks if b.ref_cnt),
            sum(1 for b in hashed if not b.ref_cnt))


def test_the_c_walk_counts_what_vllm_s_public_fields_say_and_refuses_other_blocks():
    """The scrape's walk over vLLM's blocks reads the two ``__slots__`` fields by offset
    in C; it must count exactly what the blocks' public fields say (null block, in use,
    cached, emptied), and a block of another shape is a TypeError, never a wrong count."""
    from types import SimpleNamespace

    from vllm.v1.core.kv_cache_utils import KVCacheBlock

    from kvobs.adapters.vllm import block_pool as adapter

    assert adapter.slot_members(KVCacheBlock) is not None, "vLLM's blocks lost __slots__"
    manager = kv_cache_manager(40)
    rec = Recorder(engine="vllm", model="test")
    instrument_kv_cache_manager(manager, rec)
    chat_workload(manager, rec, turns=30)
    blocks = manager.block_pool.blocks
    counts = adapter.walk(blocks)
    assert counts == oracle_walk(blocks) and counts[2] > 0 and counts[1] > 0
    stranger = SimpleNamespace(block_hash=None, ref_cnt=1)
    for odd in ([stranger, *blocks], [*blocks, stranger]):
        with pytest.raises(TypeError):
            adapter.walk(odd)
