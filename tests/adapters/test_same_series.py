"""One scripted engine sequence gives the same series through every way into kvobs.

The sequence: a 64-token prompt misses (4 blocks allocated), finishes (4 blocks cached),
is pushed out of the GPU and offloaded (host stores and a gpu->host transfer), and comes
back as a host hit (host reuse, a host->gpu transfer, the read ends, 4 GPU blocks
allocated), then finishes again. It is told to kvobs three ways: the recorder's
vocabulary directly, the generic callbacks, and a third-party allocator wrapped with
``instrument_methods``. The engine suites (tests/engines/*) check each shipped adapter
against its real engine with the same kit.
"""

from __future__ import annotations

from kvobs.adapters.generic import KVCacheCallbacks, instrument_methods
from kvobs.recorder import Recorder
from kvobs.telemetry.series import snapshot_series
from kvobs.testing import Conformance

TIERS = {"gpu": (8, 16, 4096), "host": (16, 16, 4096)}
KEYS = ["k0", "k1", "k2", "k3"]


def direct(rec: Recorder) -> None:
    gpu, host = rec.add_tier("gpu", *TIERS["gpu"]), rec.add_tier("host", *TIERS["host"])
    offload, onload = rec.link("gpu", "host"), rec.link("host", "gpu")
    rec.lookup(64, keys=KEYS)
    gpu.allocate(4)
    gpu.free(4, cached=True)
    host.store(4, keys=KEYS)
    offload.transfer(4, 16384, 0.001)
    gpu.evict(4, "capacity")
    rec.lookup(64, host_hit=64, keys=KEYS)
    host.reuse(4, keys=KEYS)
    onload.transfer(4, 16384, 0.002)
    host.free(4, cached=True)
    gpu.allocate(4)
    gpu.free(4, cached=True)


def callbacks(rec: Recorder) -> None:
    kv = KVCacheCallbacks(rec, TIERS)
    kv.lookup(64)
    kv.allocate("gpu", 4)
    kv.free("gpu", 4, cached=True)
    kv.store("host", 4, keys=KEYS)
    kv.transfer("gpu", "host", 4, 16384, 0.001)
    kv.evict("gpu", 4, "capacity")
    kv.lookup(64, host_hit=64)
    kv.reuse("host", 4, keys=KEYS)
    kv.transfer("host", "gpu", 4, 16384, 0.002)
    kv.free("host", 4, cached=True)
    kv.allocate("gpu", 4)
    kv.free("gpu", 4, cached=True)


class ThirdPartyPool:
    """An engine's own pool with offload and onload, knowing nothing of kvobs."""

    def take(self, n): return list(range(n))
    def release(self, blocks): return len(blocks)
    def offload(self, keys): return len(keys)
    def onload(self, keys): return len(keys)


def wrapped(rec: Recorder) -> None:
    kv = KVCacheCallbacks(rec, TIERS)
    pool = ThirdPartyPool()

    def offloaded(n, keys):
        kv.store("host", n, keys=keys)
        kv.transfer("gpu", "host", n, n * 4096, 0.001)
        kv.evict("gpu", n)

    def onloaded(n, keys):
        kv.reuse("host", n, keys=keys)
        kv.transfer("host", "gpu", n, n * 4096, 0.002)
        kv.free("host", n, cached=True)

    instrument_methods(pool, rec, "third.pool", {
        "take": lambda ids, n: kv.allocate("gpu", len(ids)),
        "release": lambda n, blocks: kv.free("gpu", n, cached=True),
        "offload": offloaded,
        "onload": onloaded,
    })
    kv.lookup(64)
    pool.release(pool.take(4))
    pool.offload(KEYS)
    kv.lookup(64, host_hit=64)
    pool.onload(KEYS)
    pool.release(pool.take(4))


def series_of(script) -> dict:
    rec = Recorder(engine="scripted", model="m", clock_ns=iter(range(0, 10**15, 10**6)).__next__,
                   profile_reuse=False)
    script(rec)
    Conformance(rec).check(script.__name__)
    return snapshot_series(rec.snapshot())


def test_direct_callbacks_and_wrapped_engine_give_identical_series():
    expected = series_of(direct)
    assert series_of(callbacks) == expected
    assert series_of(wrapped) == expected
    assert dict((tuple(labels.items()), v) for labels, v in
                expected["kvobs_block_stores_total"])[(("tier", "host"),)] == 4
    assert expected["kvobs_offloaded_reused_blocks_total"] == [({}, 4)]
