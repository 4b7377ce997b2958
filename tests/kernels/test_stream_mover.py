"""StreamMover bookkeeping on CPU: stream order, event polling, durations, slots, failures.

The bytes move for real (CPU tensors); only CUDA streams and events are faked.
"""

from __future__ import annotations

import random

import pytest
import torch

from kvobs.kernels.cuda_backend import CudaBackend
from kvobs.kernels.stream_mover import StreamMover
from kvobs.recorder import LinkRecorder, Recorder
from tests.kernels.fake_cuda import FakeBackend
from tests.kernels.kernel_helpers import filled_pool, reference_copy, same_bytes

BLOCK = (4, 2, 8)  # 128 bytes of fp16 per block and layer


def setup(
    layers: int = 2, src_blocks: int = 64, dst_blocks: int = 48, **kwargs: object
) -> tuple[StreamMover, FakeBackend, LinkRecorder, list[torch.Tensor], list[torch.Tensor]]:
    backend = FakeBackend(
        str(kwargs.pop("direction", "h2d")), mappable=bool(kwargs.pop("mappable", True))
    )
    src = [filled_pool(src_blocks, BLOCK, torch.float16, i) for i in range(layers)]
    dst = [torch.zeros(dst_blocks, *BLOCK, dtype=torch.float16) for _ in range(layers)]
    link = Recorder(engine="test", model="m").link("host", "gpu")
    mover = StreamMover(src, dst, link=link, backend=backend, **kwargs)
    return mover, backend, link, src, dst


def test_submit_returns_before_the_device_finishes_and_poll_reports_event_time() -> None:
    mover, backend, link, _, _ = setup()
    transfer = mover.submit([(1, 2), (5, 9), (6, 10)])
    assert not transfer.finished and mover.in_flight == 1
    assert mover.poll() == 0 and link.operations == 0  # nothing done on the device yet
    stream = backend.streams["h2d"]
    stream.finish_next(at=10.0)  # start event
    stream.finish_next(at=10.25)  # end event: the copy took 250 ms of device time
    assert mover.poll() == 1
    assert transfer.finished and transfer.seconds == pytest.approx(0.25)
    assert (link.operations, link.blocks, link.bytes) == (1, 3, 3 * 2 * 128)
    assert link.seconds == pytest.approx(0.25)
    assert all(e.host_syncs == 0 for e in backend.events)  # polling never blocked the host


def test_copies_run_on_the_direction_stream_after_the_callers_work() -> None:
    mover, backend, _, _, _ = setup(direction="d2h")
    mover.submit([(0, 0)])
    assert backend.streams["d2h"].log == [
        "wait_stream compute",  # swap-out reads blocks the compute stream may still write
        "enter",
        "record e0",
        "record e1",
        "exit",
    ]
    assert backend.compute.log == []


def test_transfers_complete_in_stream_order() -> None:
    mover, backend, link, _, _ = setup()
    transfers = [mover.submit([(i, i)]) for i in range(3)]
    stream = backend.streams["h2d"]
    for at in (1.0, 1.5, 2.0, 3.0):  # first two transfers done, third still running
        stream.finish_next(at)
    assert mover.poll() == 2
    assert [t.finished for t in transfers] == [True, True, False]
    assert [t.seconds for t in transfers[:2]] == pytest.approx([0.5, 1.0])
    assert (link.operations, mover.in_flight) == (2, 1)


def test_wait_orders_the_callers_stream_without_a_host_sync() -> None:
    mover, backend, _, _, _ = setup()
    transfer = mover.submit([(3, 4)])
    transfer.wait()
    assert backend.compute.log == ["wait_event e1"]
    assert all(e.host_syncs == 0 for e in backend.events)


def test_full_ring_waits_for_the_oldest_transfer_and_counts_a_stall() -> None:
    mover, backend, link, _, _ = setup(max_in_flight=2)
    mover.submit([(0, 0)])
    mover.submit([(1, 1)])
    mover.submit([(2, 2)])
    assert mover.stalls == 1 and mover.in_flight == 2
    assert link.operations == 1  # the oldest was reported when its slot was reused
    assert len(backend.events) == 4  # two slots, two events each: nothing allocated since


def test_device_error_at_poll_counts_a_failure_and_is_raised() -> None:
    mover, backend, link, _, _ = setup()
    mover.submit([(0, 0), (1, 1)])
    second = mover.submit([(2, 2)])
    backend.events[1].error = RuntimeError("CUDA error: an illegal memory access")
    with pytest.raises(RuntimeError, match="illegal memory access"):
        mover.poll()
    assert (link.failures, link.operations, mover.in_flight) == (2, 0, 1)
    stream = backend.streams["h2d"]
    for at in (1.0, 2.0, 3.0, 4.0):
        stream.finish_next(at)
    assert mover.poll() == 1 and second.finished and link.blocks == 1


def test_error_while_enqueuing_counts_a_failure_and_frees_the_slot() -> None:
    mover, backend, link, _, _ = setup(max_in_flight=1)
    backend.stream("h2d").fail_wait = RuntimeError("CUDA error: launch failure")
    with pytest.raises(RuntimeError, match="launch failure"):
        mover.submit([(0, 0), (1, 1), (2, 2)])
    assert (link.failures, mover.in_flight) == (3, 0)
    backend.stream("h2d").fail_wait = None
    mover.submit([(0, 0)])  # the slot came back
    assert mover.stalls == 0


def test_bad_mapping_raises_before_anything_is_enqueued() -> None:
    mover, backend, link, _, dst = setup()
    with pytest.raises(ValueError, match="appears twice"):
        mover.submit([(0, 1), (2, 1)])
    assert backend.streams["h2d"].log == [] and (link.failures, mover.in_flight) == (0, 0)
    assert not any(d.any() for d in dst)


def test_empty_mapping_enqueues_nothing() -> None:
    mover, backend, link, _, _ = setup()
    transfer = mover.submit([])
    assert transfer.finished and transfer.blocks == 0
    assert backend.streams["h2d"].log == [] and mover.in_flight == 0 and link.operations == 0


@pytest.mark.parametrize("strategy", ["runs", "gather", "auto"])
@pytest.mark.parametrize("seed", range(4))
def test_every_strategy_is_byte_exact(strategy: str, seed: int) -> None:
    rng = random.Random(seed)
    mover, _, _, src, dst = setup(layers=3, strategy=strategy, staging_blocks=5)
    n = rng.randint(1, 40)
    pairs = list(zip(rng.sample(range(64), n), rng.sample(range(48), n), strict=True))
    if seed % 2:
        start = rng.randrange(48 - n + 1)
        pairs = [(start + i, start + i) for i in range(n)]
    expected = reference_copy(src, dst, pairs)
    transfer = mover.submit(torch.tensor(pairs) if seed % 2 else pairs)
    mover.synchronize()
    assert transfer.finished and all(same_bytes(d, e) for d, e in zip(dst, expected, strict=True))


def test_auto_gathers_scattered_blocks_and_dmas_runs() -> None:
    mover, _, _, _, _ = setup()
    assert mover.submit([(i * 3, i) for i in range(16)]).strategy == "gather"
    assert mover.submit([(i, 20 + i) for i in range(16)]).strategy == "runs"
    assert mover.submit([(40, 47)]).strategy == "runs"


def test_without_a_device_view_auto_falls_back_to_runs() -> None:
    mover, _, _, src, dst = setup(mappable=False)
    transfer = mover.submit([(i * 3, i) for i in range(8)])
    mover.synchronize()
    assert transfer.strategy == "runs" and same_bytes(dst[0][7], src[0][21])
    with pytest.raises(ValueError, match="strategy='gather' needs a device view"):
        setup(mappable=False, strategy="gather")


def test_steady_state_allocates_nothing() -> None:
    mover, backend, _, _, _ = setup(max_in_flight=4, strategy="gather")
    for _ in range(4):
        mover.submit([(i * 2, i) for i in range(10)])
    mover.synchronize()
    warm = backend.allocations
    for _ in range(20):
        mover.submit([(i * 2 + 1, i) for i in range(10)])
        mover.synchronize()
    assert backend.allocations == warm


def test_host_pools_are_checked_for_pinning() -> None:
    _, backend, _, _, _ = setup()
    assert backend.checked_host_layers[:2] == ["src pool layer 0", "src pool layer 1"]
    real = CudaBackend(torch.device("cuda", 0), "d2h")
    with pytest.raises(ValueError, match="dst pool layer 0: host memory is not pinned"):
        real.check_host_layer(torch.zeros(4, 8), "dst pool layer 0")


@pytest.mark.parametrize(
    ("src", "dst", "direction"),
    [("cuda:0", "cpu", "d2h"), ("cpu", "cuda:0", "h2d"), ("cuda:1", "cuda:1", "d2d")],
)
def test_direction_follows_the_pools_devices(src: str, dst: str, direction: str) -> None:
    backend = CudaBackend.for_pools(torch.device(src), torch.device(dst))
    assert backend.direction == direction
    assert backend.device.type == "cuda"


def test_unsupported_device_pairs_are_rejected() -> None:
    with pytest.raises(ValueError, match="use BlockMover for host <-> host"):
        CudaBackend.for_pools(torch.device("cpu"), torch.device("cpu"))
    with pytest.raises(ValueError, match="peer copies are not supported"):
        CudaBackend.for_pools(torch.device("cuda", 0), torch.device("cuda", 1))
    with pytest.raises(ValueError, match="strategy='fast' is not one of"):
        setup(strategy="fast")
