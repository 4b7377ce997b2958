"""One scripted event sequence with hand-known results, shared by the sink tests."""

from kvobs.recorder import Recorder


def scripted_recorder() -> Recorder:
    rec = Recorder(engine="scripted", model="tiny")
    gpu = rec.add_tier("gpu", capacity_blocks=100, block_tokens=16, block_bytes=4096)
    host = rec.add_tier("host", capacity_blocks=400, block_tokens=16, block_bytes=4096)
    gpu.allocate(10)
    gpu.free(4, cached=True)
    gpu.reuse(1)
    gpu.evict(2, "capacity")
    host.store(2)
    host.evict(1, "explicit")
    rec.lookup(160, gpu_hit=64, host_hit=32)
    rec.lookup(40)
    offload, onload = rec.link("gpu", "host"), rec.link("host", "gpu")
    offload.transfer(2, 8192, 0.00002)  # 20 us
    onload.transfer(1, 4096, 0.003)  # 3 ms
    onload.transfer(1, 4096, 0.2)  # 200 ms
    onload.fail(1, 4096)
    offload.drop(3)
    rec.thrash.offloaded(["a", "b"])
    rec.thrash.onloaded(["a"])
    rec.thrash.evicted(["b"])
    return rec
