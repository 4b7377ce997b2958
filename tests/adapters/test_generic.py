"""The generic protocol: callbacks and method wrapping for engines without an adapter."""

from __future__ import annotations

import pytest

from kvobs.adapters import AdapterError
from kvobs.adapters.generic import KVCacheCallbacks, instrument_methods
from kvobs.errors import ConfigError
from kvobs.recorder import Recorder


class PrefixPool:
    """A small engine-side allocator with prefix reuse, as a third-party engine has."""

    def __init__(self, blocks: int) -> None:
        self.free_ids = list(range(blocks))
        self.cached: dict[str, int] = {}

    def alloc(self, n: int) -> list[int]:
        if n > len(self.free_ids):
            raise MemoryError(f"need {n} blocks, {len(self.free_ids)} free")
        return [self.free_ids.pop() for _ in range(n)]

    def release(self, ids: list[int]) -> None:
        self.free_ids.extend(ids)


def test_wrapped_allocator_counts_and_keeps_engine_behaviour():
    rec = Recorder(engine="custom")
    kv = KVCacheCallbacks(rec, {"gpu": (8, 16, 4096), "host": (32, 16, 4096)})
    pool = PrefixPool(8)
    inst = instrument_methods(pool, rec, "custom.pool", {
        "alloc": lambda ids, n: kv.allocate("gpu", len(ids)),
        "release": lambda _, ids: kv.free("gpu", len(ids), cached=True),
    })
    first = pool.alloc(5)
    pool.release(first[:3])
    with pytest.raises(MemoryError, match="need 9 blocks"):
        pool.alloc(9)
    kv.reuse("gpu", 2)
    kv.evict("gpu", 1)
    kv.lookup(64, gpu_hit=32, host_hit=16)
    kv.transfer("gpu", "host", blocks=2, nbytes=8192, seconds=0.001)
    kv.fail("host", "gpu", blocks=1)

    snap = rec.snapshot()
    gpu = snap.tier("gpu")
    assert (gpu.allocations, gpu.frees, gpu.reuses, gpu.evictions_total) == (5, 3, 2, 1)
    assert (gpu.in_use_blocks, gpu.cached_blocks) == (4, 0)
    assert snap.lookups.outcomes() == {"gpu_hit": 32, "host_hit": 16, "disk_hit": 0, "miss": 16}
    assert snap.link("gpu", "host").bytes == 8192 and snap.link("host", "gpu").failures == 1
    inst.unwrap()
    assert pool.alloc.__func__ is PrefixPool.alloc


def test_callback_failures_are_counted_never_raised():
    rec = Recorder()
    kv = KVCacheCallbacks(rec, {"gpu": (8, 16, 4096)})
    kv.allocate("nvme", 1)                            # a tier it was never told about
    pool = PrefixPool(4)
    instrument_methods(pool, rec, "custom.pool", {"alloc": lambda ids, n: 1 / 0})
    assert pool.alloc(2) == [3, 2]
    assert rec.snapshot().errors == {"generic": 1, "custom.pool": 1}


def test_bad_configuration_is_a_clear_error():
    with pytest.raises(ConfigError, match="capacity_blocks, block_tokens, block_bytes"):
        KVCacheCallbacks(Recorder(), {"gpu": 8})  # type: ignore[dict-item]
    with pytest.raises(ConfigError, match="has no method"):
        instrument_methods(PrefixPool(1), Recorder(), "custom", {"allocate": print})
    pool = PrefixPool(1)
    instrument_methods(pool, Recorder(), "custom", {"alloc": print})
    with pytest.raises(AdapterError, match="already instrumented"):
        instrument_methods(pool, Recorder(), "custom", {"alloc": print})
