"""One scripted event sequence with hand-known results, shared by the sink tests."""

from kvobs.recorder import Recorder


def scripted_recorder() -> Recorder:
    clock = iter(range(0, 10**12, 10**9)).__next__  # one virtual second per keyed event
    rec = Recorder(engine="scripted", model="tiny", clock_ns=clock, residency_rate=1.0)
    rec.prefill_cost.set(1e-4, "configured")
    gpu = rec.add_tier("gpu", capacity_blocks=100, block_tokens=16, block_bytes=4096)
    host = rec.add_tier("host", capacity_blocks=400, block_tokens=16, block_bytes=4096)
    gpu.allocate(10)
    gpu.free(4, cached=True)
    gpu.reuse(1)
    gpu.evict(2, "capacity")
    host.store(2, keys=("a", "b"))       # offloads: thrash tracking and residency
    host.reuse(1, keys=("a",))           # an onload: a reused offload, inside the window
    host.free(1, cached=True)
    host.evict(1, "explicit", keys=("b",))  # an offload evicted before any reuse
    rec.lookup(160, gpu_hit=64, host_hit=32, keys=list(range(10)))
    rec.lookup(40, keys=[0, 1, 20])
    offload, onload = rec.link("gpu", "host"), rec.link("host", "gpu")
    offload.transfer(2, 8192, 0.00002)  # 20 us
    onload.transfer(1, 4096, 0.003)  # 3 ms
    onload.transfer(1, 4096, 0.2)  # 200 ms
    onload.fail(1, 4096)
    offload.drop(3)
    return rec
