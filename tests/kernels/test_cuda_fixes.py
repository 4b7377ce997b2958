"""Fixes of the CUDA path, checked on CPU with the fake streams and events.

- a submit that fails after queuing work gives up its index buffers (the device may
  still read them) instead of handing them to the next submit;
- the gather staging buffer serves layers of different word sizes;
- a "device view" of host memory that is a copy, not an alias, is refused;
- ``BlockMover`` is safe from several threads; ``StreamMover`` refuses a second thread.
"""

from __future__ import annotations

import random
import threading

import pytest
import torch

from kvobs.kernels import BlockMover
from kvobs.kernels.cuda_backend import CudaBackend, aliases, as_words
from kvobs.kernels.stream_mover import StreamMover
from kvobs.recorder import Recorder
from tests.kernels.fake_cuda import FakeBackend
from tests.kernels.kernel_helpers import filled_pool, reference_copy, same_bytes


def mover_over(layers: list[tuple[tuple[int, ...], torch.dtype]], src_blocks: int = 64,
               dst_blocks: int = 48, **kwargs: object):  # type: ignore[no-untyped-def]
    backend = FakeBackend("h2d")
    src = [filled_pool(src_blocks, shape, dtype, i) for i, (shape, dtype) in enumerate(layers)]
    dst = [torch.zeros(dst_blocks, *shape, dtype=dtype) for shape, dtype in layers]
    link = Recorder(engine="t", model="m").link("host", "gpu")
    return StreamMover(src, dst, link=link, backend=backend, **kwargs), backend, link, src, dst


FP16 = [((4, 2, 8), torch.float16)] * 2


def test_failed_submit_after_queuing_gives_up_its_index_buffer() -> None:
    mover, backend, link, src, dst = mover_over(FP16, max_in_flight=1, strategy="gather")
    scattered = [(i * 3, i) for i in range(10)]
    first = mover.submit(scattered)
    mover.synchronize()
    assert first.finished
    used = backend.host_buffers[-1]
    # The end event fails to record: the index upload and the kernels are already queued.
    end = backend.events[1]
    end.fail_record = RuntimeError("CUDA error: launch failure")
    with pytest.raises(RuntimeError, match="launch failure"):
        mover.submit([(i * 3 + 1, i) for i in range(10)])
    assert link.failures == 10 and mover.in_flight == 0
    end.fail_record = None
    snapshot = used.clone()
    pairs = [(i * 3 + 2, 20 + i) for i in range(10)]
    expected = reference_copy(src, dst, pairs)
    mover.submit(pairs)
    mover.synchronize()
    # The next submit wrote its ids into a new buffer, not under the queued upload.
    assert backend.host_buffers[-1] is not used and torch.equal(used, snapshot)
    assert all(same_bytes(d, e) for d, e in zip(dst, expected, strict=True))


def test_failure_before_anything_is_queued_keeps_the_buffers() -> None:
    mover, backend, link, _, _ = mover_over(FP16, max_in_flight=1, strategy="gather")
    mover.submit([(i * 3, i) for i in range(10)])
    mover.synchronize()
    warm = backend.allocations
    backend.stream("h2d").fail_wait = RuntimeError("CUDA error: launch failure")
    with pytest.raises(RuntimeError):
        mover.submit([(i * 3, i) for i in range(10)])
    backend.stream("h2d").fail_wait = None
    mover.submit([(i * 3, i) for i in range(10)])
    mover.synchronize()
    assert backend.allocations == warm and link.failures == 10


MIXED = [
    ((5,), torch.float16),  # 10 bytes a block: int16 words
    ((2,), torch.float32),  # 8 bytes: int64 words
    ((3, 4), torch.int8),  # 12 bytes, the widest block: int32 words
]


@pytest.mark.parametrize("staging_blocks", [1, 3, 5, 256])
@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("extra", [[], [((2, 2, 8), torch.bfloat16)]], ids=["3-layers", "4"])
def test_gather_staging_serves_layers_of_different_word_sizes(
        staging_blocks: int, seed: int, extra: list) -> None:
    # 5 chunks of the widest block (12 bytes) are 60 bytes: not a whole number of int64
    # words, which is what viewing the whole staging buffer as int64 needed.
    mover, _, _, src, dst = mover_over(MIXED + extra, strategy="gather",
                                       staging_blocks=staging_blocks)
    assert [v[0].dtype for v in mover._views or []][:3] == [torch.int16, torch.int64,
                                                            torch.int32]
    rng = random.Random(seed)
    n = rng.randint(1, 40)
    pairs = list(zip(rng.sample(range(64), n), rng.sample(range(48), n), strict=True))
    expected = reference_copy(src, dst, pairs)
    transfer = mover.submit(pairs)
    mover.synchronize()
    assert transfer.strategy == "gather"
    assert all(same_bytes(d, e) for d, e in zip(dst, expected, strict=True))


def test_a_device_view_that_copies_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    layer = torch.zeros(8, 16, dtype=torch.float16)
    words = as_words(layer)
    assert words is not None
    backend = CudaBackend(torch.device("cpu"), "d2h")  # the checks, without a GPU

    monkeypatch.setattr(torch, "as_tensor", lambda array, device=None: words[0].clone())
    assert backend.word_view(layer) is None  # a copy: writes to it would be lost
    monkeypatch.setattr(torch, "as_tensor", lambda array, device=None: words[0])
    view = backend.word_view(layer)
    assert view is not None and view.data_ptr() == layer.data_ptr()
    assert not aliases(words[0], words[0], torch.device("cuda", 1))  # wrong device
    assert not aliases(words[0][:4], words[0], torch.device("cpu"))  # not the whole layer


def test_block_mover_is_safe_from_several_threads() -> None:
    blocks = 512
    src = filled_pool(blocks, (2, 16, 8, 16), torch.float16, 1)  # 8 KiB blocks
    dst = torch.zeros_like(src)
    mover = BlockMover(src, dst)
    errors: list[BaseException] = []
    barrier = threading.Barrier(4)

    def copier(worker: int) -> None:
        rng = random.Random(worker)
        try:
            barrier.wait(timeout=10)
            for _ in range(40):
                # Each thread owns its destination ids: results are checkable.
                dst_ids = rng.sample(range(worker, blocks, 4), 32)
                pairs = [(d, d) for d in dst_ids]
                mover.copy(pairs)
                for d in dst_ids:
                    assert same_bytes(dst[d], src[d])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=copier, args=(w,)) for w in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors, errors[0]


def test_stream_mover_refuses_a_second_thread() -> None:
    mover, backend, _, _, _ = mover_over(FP16)
    inside, release = threading.Event(), threading.Event()

    def hold() -> None:
        inside.set()
        release.wait(10)

    backend.inside_use = hold
    worker = threading.Thread(target=mover.submit, args=([(0, 0)],))
    worker.start()
    assert inside.wait(10)
    try:
        for call in (mover.poll, mover.synchronize, lambda: mover.submit([(1, 1)])):
            with pytest.raises(RuntimeError, match="another thread is inside this mover"):
                call()
    finally:
        release.set()
        worker.join(timeout=10)
    backend.inside_use = None
    mover.synchronize()  # the owner goes on
    assert mover.in_flight == 0
