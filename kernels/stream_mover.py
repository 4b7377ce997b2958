"""Asynchronous block moves to and from a GPU, timed on the device and polled, never awaited.

``StreamMover.submit`` validates the mapping, makes the direction's dedicated stream wait
for the caller's prior work, records a start event, issues non-blocking copies and an end
event, and returns at once. ``poll`` (call it from the engine's step loop) checks the
oldest pending transfers with ``event.query()``, which never blocks, and hands each
completed one to the link with the duration the two events measured on the device.

Two ways to move the bytes, chosen per batch:

- ``runs``: one ``copy_(non_blocking=True)`` per coalesced run and layer. DMA engines
  reach pinned ``cudaMemcpy`` bandwidth when runs are long.
- ``gather``: when runs are short (scattered blocks), one index upload and two kernels
  per layer: ``index_select`` into a preallocated device staging buffer, then
  ``index_copy_`` into the destination. The host pool is reached through its UVA
  device view, so the GPU reads or writes pinned host memory directly and the per-block
  cost of a DMA call disappears.

A ``StreamMover`` belongs to one thread at a time (the engine's step loop): its slots,
pending queue and staging buffer are not locked. Two threads inside ``submit`` /
``poll`` / ``synchronize`` at once raise ``RuntimeError`` instead of corrupting them.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from kvobs.kernels.cuda_backend import Backend, CudaBackend, EventLike
from kvobs.kernels.link import TransferLink, report_completed, report_failed
from kvobs.kernels.plan import MappingLike, RunPlanner
from kvobs.kernels.pools import Pool, PoolLike, as_pool, check_compatible

# Batches whose runs average fewer blocks than this go through the gather kernels.
GATHER_BELOW_RUN_BLOCKS = 8
STRATEGIES = ("auto", "runs", "gather")


class Transfer:
    """Handle of one submitted transfer; ``seconds`` is set once a poll saw it complete."""

    __slots__ = ("_end", "_mover", "blocks", "failed", "finished", "nbytes", "seconds", "strategy")

    def __init__(
        self,
        mover: StreamMover | None,
        end: EventLike | None,
        blocks: int,
        nbytes: int,
        strategy: str,
    ) -> None:
        self._mover, self._end = mover, end
        self.blocks, self.nbytes, self.strategy = blocks, nbytes, strategy
        self.finished = mover is None
        self.failed = False
        self.seconds = 0.0

    def wait(self) -> None:
        """Make the caller's current stream wait for this transfer; the host does not block."""
        if not self.finished and self._mover is not None and self._end is not None:
            self._mover.backend.current_stream().wait_event(self._end)

    def synchronize(self) -> None:
        """Block the host until this transfer is done, then report everything completed."""
        if not self.finished and self._end is not None and self._mover is not None:
            self._end.synchronize()
            self._mover.poll()


class _Slot:
    """Per-transfer reusable state: two timing events and the index buffers of a gather."""

    def __init__(self, backend: Backend) -> None:
        self.start = backend.event()
        self.end = backend.event()
        self.host_idx: torch.Tensor | None = None
        self.device_idx: torch.Tensor | None = None
        self.transfer: Transfer | None = None
        # Set once work that reads this slot's index buffers may be queued on the stream.
        self.enqueued = False


class StreamMover:
    """Moves blocks between a GPU pool and a pinned host pool (or two pools on one GPU).

    Args:
        src: source pool (tensor ``[num_blocks, ...]`` or list of per-layer tensors).
        dst: destination pool, same layers, dtypes and block shapes.
        link: optional ``TransferLink``, e.g. ``rec.link("gpu", "host")``.
        max_in_flight: transfers pending at once; a submit beyond it first waits for the
            oldest (counted in ``stalls``).
        staging_blocks: blocks per gather chunk (device staging is allocated once).
        strategy: ``"auto"``, ``"runs"`` or ``"gather"``.
        backend: streams and events; ``CudaBackend`` for the pools' devices by default.

    Example (on a GPU host)::

        gpu = torch.zeros(1024, 2, 16, 8, 128, dtype=torch.float16, device="cuda")
        host = torch.zeros(4096, 2, 16, 8, 128, dtype=torch.float16, pin_memory=True)
        swap_out = StreamMover(gpu, host, link=rec.link("gpu", "host"))
        transfer = swap_out.submit([(3, 100), (4, 101)])  # returns at once
        swap_out.poll()  # later, e.g. once per engine step: reports finished transfers
    """

    def __init__(
        self,
        src: PoolLike | Pool,
        dst: PoolLike | Pool,
        *,
        link: TransferLink | None = None,
        max_in_flight: int = 32,
        staging_blocks: int = 256,
        strategy: str = "auto",
        backend: Backend | None = None,
    ) -> None:
        if strategy not in STRATEGIES:
            raise ValueError(f"strategy={strategy!r} is not one of {STRATEGIES}")
        if max_in_flight < 1 or staging_blocks < 1:
            raise ValueError("max_in_flight and staging_blocks must be at least 1")
        self.src, self.dst = as_pool(src, "src"), as_pool(dst, "dst")
        check_compatible(self.src, self.dst)
        self.backend: Backend = backend or CudaBackend.for_pools(self.src.device, self.dst.device)
        self.direction = self.backend.direction
        for pool, role in ((self.src, "src"), (self.dst, "dst")):
            if pool.device.type == "cpu":
                for i, layer in enumerate(pool.layers):
                    self.backend.check_host_layer(layer, f"{role} pool layer {i}")
        self.link = link
        self.strategy = strategy
        self.staging_blocks = staging_blocks
        self.stalls = 0
        self._planner = RunPlanner(self.src.num_blocks, self.dst.num_blocks)
        self._stream = self.backend.stream(self.direction)
        self._free = deque(_Slot(self.backend) for _ in range(max_in_flight))
        self._pending: deque[_Slot] = deque()
        self._views = self._gather_views() if strategy != "runs" else None
        if strategy == "gather" and self._views is None:
            raise ValueError(
                "strategy='gather' needs a device view of every layer (pinned host memory "
                "mapped into the GPU's address space); use strategy='runs'"
            )
        self._staging: torch.Tensor | None = None
        self._busy = threading.Lock()

    @contextmanager
    def _owned(self, what: str) -> Iterator[None]:
        if not self._busy.acquire(blocking=False):
            raise RuntimeError(
                f"StreamMover.{what} called while another thread is inside this mover; a "
                "StreamMover belongs to one thread (the engine's step loop): use one per thread"
            )
        try:
            yield
        finally:
            self._busy.release()

    @property
    def in_flight(self) -> int:
        """Transfers submitted and not yet seen complete by ``poll``."""
        return len(self._pending)

    def submit(self, mapping: MappingLike) -> Transfer:
        """Enqueue ``src[s] -> dst[d]`` for each pair on the direction's stream and return.

        Raises:
            ValueError: for a bad mapping, before any byte moves (not counted as a failure).
            RuntimeError: another thread is inside this mover.
        """
        with self._owned("submit"):
            return self._submit(mapping)

    def _submit(self, mapping: MappingLike) -> Transfer:
        blocks, n_runs = self._planner.plan(mapping)
        if blocks == 0:
            return Transfer(None, None, 0, 0, "none")
        strategy = self._choose(blocks, n_runs)
        slot = self._take_slot()
        nbytes = blocks * self.src.bytes_per_block
        stream = self._stream
        try:
            stream.wait_stream(self.backend.current_stream())
            with self.backend.use(stream):
                slot.start.record(stream)
                if strategy == "gather":
                    self._gather(slot, mapping, blocks)
                else:
                    self._copy_runs(n_runs)
                slot.end.record(stream)
        except BaseException:
            if slot.enqueued:
                # Copies already queued may still read this slot's pinned index buffer:
                # give it up (torch's allocators keep the memory until the stream is past
                # it) rather than let the next submit overwrite it under the device.
                slot.host_idx = slot.device_idx = None
                slot.enqueued = False
            self._free.append(slot)
            report_failed(self.link, blocks, nbytes)
            raise
        slot.transfer = Transfer(self, slot.end, blocks, nbytes, strategy)
        self._pending.append(slot)
        return slot.transfer

    def poll(self) -> int:
        """Report every transfer that completed, oldest first; never blocks.

        Returns:
            How many transfers completed since the last poll.

        Raises:
            RuntimeError: the device error of a failed transfer (after it is counted), or
                another thread is inside this mover.
        """
        with self._owned("poll"):
            return self._poll()

    def _poll(self) -> int:
        completed = 0
        while self._pending:
            slot = self._pending[0]
            transfer = slot.transfer
            assert transfer is not None
            try:
                if not slot.end.query():
                    break
                seconds = slot.start.elapsed_time(slot.end) / 1e3
            except BaseException:
                self._retire(slot)
                transfer.failed = True
                report_failed(self.link, transfer.blocks, transfer.nbytes)
                raise
            self._retire(slot)
            transfer.seconds = seconds
            report_completed(self.link, transfer.blocks, transfer.nbytes, seconds)
            completed += 1
        return completed

    def synchronize(self) -> None:
        """Block the host until every pending transfer is done, and report them."""
        with self._owned("synchronize"):
            while self._pending:
                self._pending[-1].end.synchronize()
                self._poll()

    def _retire(self, slot: _Slot) -> None:
        self._pending.popleft()
        slot.enqueued = False  # the stream is past everything this slot queued
        if slot.transfer is not None:
            slot.transfer.finished = True
            slot.transfer = None
        self._free.append(slot)

    def _take_slot(self) -> _Slot:
        if not self._free:
            self._poll()
        if not self._free:
            self.stalls += 1
            self._pending[0].end.synchronize()
            self._poll()
        return self._free.popleft()

    def _choose(self, blocks: int, n_runs: int) -> str:
        if self.strategy != "auto":
            return self.strategy
        if self._views is not None and n_runs > 1 and blocks < GATHER_BELOW_RUN_BLOCKS * n_runs:
            return "gather"
        return "runs"

    def _copy_runs(self, n_runs: int) -> None:
        pairs = tuple(zip(self.src.layers, self.dst.layers, strict=True))
        for s, d, n in self._planner.runs(n_runs).tolist():
            for src, dst in pairs:
                dst[d : d + n].copy_(src[s : s + n], non_blocking=True)

    def _gather_views(self) -> list[tuple[torch.Tensor, torch.Tensor]] | None:
        views = []
        for src, dst in zip(self.src.layers, self.dst.layers, strict=True):
            src_words, dst_words = self.backend.word_view(src), self.backend.word_view(dst)
            if src_words is None or dst_words is None or src_words.dtype != dst_words.dtype:
                return None
            views.append((src_words, dst_words))
        return views

    def _gather(self, slot: _Slot, mapping: MappingLike, blocks: int) -> None:
        assert self._views is not None
        pairs = torch.as_tensor(mapping, dtype=torch.int64).reshape(blocks, 2)
        if slot.host_idx is None or slot.host_idx.numel() < 2 * blocks:
            slot.host_idx = self.backend.empty_host(2 * blocks)
            slot.device_idx = self.backend.empty_device(2 * blocks, torch.int64)
        assert slot.device_idx is not None
        slot.host_idx[: 2 * blocks].view(2, blocks).copy_(pairs.t())
        device_idx = slot.device_idx[: 2 * blocks]
        slot.enqueued = True  # from here the device may read host_idx asynchronously
        device_idx.copy_(slot.host_idx[: 2 * blocks], non_blocking=True)
        staging = self._staging_buffer()
        for first in range(0, blocks, self.staging_blocks):
            last = min(first + self.staging_blocks, blocks)
            src_idx, dst_idx = device_idx[first:last], device_idx[blocks + first : blocks + last]
            for src_words, dst_words in self._views:
                words = src_words.shape[1]
                # Slice the bytes this chunk needs, then view them in this layer's word
                # type: layers may differ (int64 words for one, int16 for another), and
                # the whole buffer is not a multiple of every word size.
                need = (last - first) * words * src_words.element_size()
                stage = staging[:need].view(src_words.dtype).view(last - first, words)
                torch.index_select(src_words, 0, src_idx, out=stage)
                dst_words.index_copy_(0, dst_idx, stage)

    def _staging_buffer(self) -> Any:
        if self._staging is None:
            assert self._views is not None
            largest = max(s.shape[1] * s.element_size() for s, _ in self._views)
            self._staging = self.backend.empty_device(self.staging_blocks * largest, torch.uint8)
        return self._staging
