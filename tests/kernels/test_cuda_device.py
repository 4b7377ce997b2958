"""The CUDA path on a real GPU (skipped without one; run by benchmarks/gpu_check.sh)."""

from __future__ import annotations

import random

import pytest
import torch

from kvobs.kernels import StreamMover, copy_blocks
from kvobs.recorder import Recorder
from tests.kernels.kernel_helpers import filled_pool, reference_copy, same_bytes

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

BLOCK = (2, 16, 8, 128)  # Llama-3-8B, 16 tokens per block, one layer: 64 KiB in fp16


def pools(layers: int, blocks: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    gpu = [filled_pool(blocks, BLOCK, torch.float16, i).cuda() for i in range(layers)]
    host = [filled_pool(blocks, BLOCK, torch.float16, 50 + i).pin_memory() for i in range(layers)]
    return gpu, host


@pytest.mark.parametrize("direction", ["d2h", "h2d"])
@pytest.mark.parametrize("strategy", ["runs", "gather", "auto"])
@pytest.mark.parametrize("contiguous", [False, True])
def test_swaps_are_byte_exact_and_reported(direction: str, strategy: str, contiguous: bool) -> None:
    gpu, host = pools(layers=2, blocks=256)
    src, dst = (gpu, host) if direction == "d2h" else (host, gpu)
    rng = random.Random(hash((direction, strategy, contiguous)) & 0xFFFF)
    n = 100
    if contiguous:
        pairs = [(10 + i, 120 + i) for i in range(n)]
    else:
        pairs = list(zip(rng.sample(range(256), n), rng.sample(range(256), n), strict=True))
    expected = [
        t.cpu() for t in reference_copy([t.cpu() for t in src], [t.cpu() for t in dst], pairs)
    ]
    link = Recorder(engine="test", model="m").link(
        *(("gpu", "host") if direction == "d2h" else ("host", "gpu"))
    )
    mover = StreamMover(src, dst, link=link, strategy=strategy, staging_blocks=64)
    transfer = mover.submit(pairs)
    mover.synchronize()
    assert transfer.finished and transfer.seconds > 0
    assert all(same_bytes(d.cpu(), e) for d, e in zip(dst, expected, strict=True))
    assert (link.operations, link.blocks, link.bytes) == (1, n, n * 2 * 65536)


def test_gather_reaches_pinned_host_memory_through_uva() -> None:
    gpu, host = pools(layers=1, blocks=8)
    assert StreamMover(gpu, host)._views is not None, "no device view of pinned host memory"


def test_durations_are_device_time_not_dispatch_time() -> None:
    gpu, host = pools(layers=1, blocks=2048)  # 128 MiB each way
    link = Recorder(engine="test", model="m").link("gpu", "host")
    mover = StreamMover(gpu, host, link=link)
    transfer = mover.submit([(i, i) for i in range(2048)])
    mover.synchronize()
    # PCIe moves at most ~64 GB/s: 128 MiB cannot take less than ~2 ms. Timing the
    # dispatch on the host would report microseconds.
    assert transfer.seconds > 128 * 2**20 / 100e9


def test_wait_orders_the_compute_stream_without_host_sync() -> None:
    gpu, host = pools(layers=1, blocks=512)
    mover = StreamMover(host, gpu)
    transfer = mover.submit([(i, i) for i in range(512)])
    transfer.wait()  # the current stream now waits for the swap-in on the device
    checksum = gpu[0].view(torch.int16).sum()  # queued after the swap-in
    assert int(checksum) == int(host[0].view(torch.int16).sum())
    mover.synchronize()


def test_unpinned_host_pool_is_rejected() -> None:
    gpu = torch.zeros(4, 8, device="cuda")
    with pytest.raises(ValueError, match="not pinned"):
        StreamMover(gpu, torch.zeros(4, 8))


def test_copy_blocks_waits_for_a_gpu_transfer() -> None:
    gpu, host = pools(layers=1, blocks=16)
    copy_blocks(gpu, host, [(3, 5)])
    assert same_bytes(host[0][5], gpu[0][3].cpu())


def test_gather_serves_layers_of_different_word_sizes() -> None:
    layers = [((5,), torch.float16), ((2,), torch.float32), ((3, 4), torch.int8)]
    gpu = [filled_pool(64, shape, dtype, i).cuda() for i, (shape, dtype) in enumerate(layers)]
    host = [filled_pool(64, shape, dtype, 9 + i).pin_memory()
            for i, (shape, dtype) in enumerate(layers)]
    pairs = [(i * 3 % 64, i) for i in range(21)]
    expected = reference_copy([t.cpu() for t in gpu], [t.clone() for t in host], pairs)
    mover = StreamMover(gpu, host, strategy="gather", staging_blocks=5)
    transfer = mover.submit(pairs)
    mover.synchronize()
    assert transfer.strategy == "gather"
    assert all(same_bytes(d, e) for d, e in zip(host, expected, strict=True))


def test_device_views_of_pinned_host_memory_alias_it() -> None:
    gpu, host = pools(layers=2, blocks=8)
    views = StreamMover(gpu, host)._views
    assert views is not None
    for (_, dst_view), layer in zip(views, host, strict=True):
        assert dst_view.is_cuda and dst_view.data_ptr() == layer.data_ptr()
