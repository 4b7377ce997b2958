"""Every transfer reaches the kvobs recorder: blocks, bytes, duration, failures."""

from __future__ import annotations

import doctest
import importlib
import logging

import pytest
import torch

from kvobs.kernels import BlockMover, TransferLink, copy_blocks
from kvobs.recorder import Recorder
from tests.kernels.kernel_helpers import filled_pool


def test_recorder_link_receives_blocks_bytes_and_duration() -> None:
    rec = Recorder(engine="test", model="llama")
    link = rec.link("gpu", "host")
    assert isinstance(link, TransferLink)
    layers = [filled_pool(32, (16, 8, 128), torch.float16, i) for i in range(2)]
    host = [torch.zeros(64, 16, 8, 128, dtype=torch.float16) for _ in range(2)]
    mover = BlockMover(layers, host, link=link)
    mover.copy([(0, 10), (1, 11), (7, 3)])
    mover.copy(torch.tensor([[5, 40]]))
    mover.copy([])  # nothing moved, nothing reported
    snap = link.snapshot()
    block_bytes = 2 * 16 * 8 * 128 * 2  # two layers of 16 tokens x 8 heads x 128 dims, fp16
    assert (snap.operations, snap.blocks, snap.bytes) == (2, 4, 4 * block_bytes)
    durations = link.drain_durations()
    assert len(durations) == 2 and all(0 < d < 1 for d in durations)
    assert snap.failures == 0


def test_copy_blocks_reports_to_the_link() -> None:
    link = Recorder(engine="test", model="m").link("host", "gpu")
    copy_blocks(torch.ones(8, 1024), torch.zeros(8, 1024), [(1, 2)], link=link)
    assert (link.operations, link.blocks, link.bytes) == (1, 1, 4096)


def test_a_failing_copy_is_counted_and_re_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    link = Recorder(engine="test", model="m").link("gpu", "host")
    mover = BlockMover(torch.ones(8, 64), torch.zeros(8, 64), link=link)

    def broken(*_: object) -> None:
        raise MemoryError("simulated copy failure")

    monkeypatch.setattr(mover._copier, "copy", broken)  # fault injection, our own code
    with pytest.raises(MemoryError):
        mover.copy([(0, 0), (1, 1)])
    assert (link.failures, link.operations) == (2, 0)


def test_a_broken_link_never_breaks_the_copy(caplog: pytest.LogCaptureFixture) -> None:
    class Broken:
        def completed(self, blocks: int, nbytes: int, seconds: float) -> None:
            raise RuntimeError("sink bug")

        def failed(self, blocks: int, nbytes: int = 0) -> None:
            raise RuntimeError("sink bug")

    src, dst = torch.arange(32.0).reshape(8, 4), torch.zeros(8, 4)
    with caplog.at_level(logging.ERROR):
        BlockMover(src, dst, link=Broken()).copy([(7, 0)])
    assert dst[0].tolist() == [28.0, 29.0, 30.0, 31.0]
    assert "link.completed raised" in caplog.text


@pytest.mark.parametrize(
    "module",
    ["__init__", "link", "pools", "plan", "cpu_copy", "mover", "cuda_backend", "stream_mover"],
)
def test_docstring_examples_run(module: str) -> None:
    name = "kvobs.kernels" if module == "__init__" else f"kvobs.kernels.{module}"
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
