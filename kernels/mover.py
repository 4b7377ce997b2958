"""Synchronous block moves between host pools, timed and reported to a link.

``BlockMover`` is the reusable object: pools are validated and scratch is allocated once,
then each ``copy`` validates its mapping, moves the bytes and reports blocks, bytes and
the copy's ``perf_counter_ns`` duration to the link. ``copy_blocks`` is the one-shot form
and also covers CUDA pools (through ``StreamMover``, waiting for the transfer to land).
"""

from __future__ import annotations

import threading
import time
from typing import NamedTuple

from kvobs.kernels.cpu_copy import STREAM_BYTES, HostCopier
from kvobs.kernels.link import TransferLink, report_completed, report_failed
from kvobs.kernels.plan import MappingLike, RunPlanner
from kvobs.kernels.pools import Pool, PoolLike, as_pool, check_compatible


class TransferStats(NamedTuple):
    """What one finished transfer moved and how long the bytes took to move."""

    blocks: int
    nbytes: int
    seconds: float


_NOTHING_MOVED = TransferStats(0, 0, 0.0)


class BlockMover:
    """Moves blocks between two host pools, synchronously.

    Args:
        src: source pool, a ``[num_blocks, ...]`` CPU tensor or a list of per-layer ones.
        dst: destination pool with the same layers, dtypes and block shapes.
        link: optional ``TransferLink`` (e.g. ``rec.link("host", "host")``) told about
            every transfer.
        stream_bytes: a copy of at least this many bytes bypasses the CPU cache
            (non-temporal stores); -1 never does.

    Thread safety: ``copy`` may be called from several threads. Planning writes the
    mover's run buffer and the C loop reads it with the GIL released, so calls on one
    mover take turns (an uncontended lock costs well under a microsecond); use one mover
    per thread to copy in parallel.

    Example:
        >>> import torch
        >>> src, dst = torch.randn(64, 16, 8), torch.zeros(32, 16, 8)
        >>> mover = BlockMover(src, dst)
        >>> mover.copy([(5, 0), (6, 1), (40, 7)])[:2]  # (blocks, nbytes, seconds)
        (3, 1536)
        >>> bool((dst[7] == src[40]).all())
        True
    """

    def __init__(
        self,
        src: PoolLike | Pool,
        dst: PoolLike | Pool,
        *,
        link: TransferLink | None = None,
        stream_bytes: int = STREAM_BYTES,
    ) -> None:
        self.src = as_pool(src, "src")
        self.dst = as_pool(dst, "dst")
        check_compatible(self.src, self.dst)
        for pool, role in ((self.src, "src"), (self.dst, "dst")):
            if pool.device.type != "cpu":
                raise ValueError(
                    f"{role} pool is on {pool.device}; BlockMover moves between host pools, "
                    "use StreamMover when a pool is on a GPU"
                )
        self.link = link
        self._planner = RunPlanner(self.src.num_blocks, self.dst.num_blocks)
        self._copier = HostCopier(self.src, self.dst, stream_bytes=stream_bytes)
        self._bytes_per_block = self.src.bytes_per_block
        self._lock = threading.Lock()  # the planner's run buffer is shared scratch

    def copy(self, mapping: MappingLike) -> TransferStats:
        """Copy ``src[s]`` to ``dst[d]`` for every pair of ``mapping``, then report it.

        Raises:
            ValueError: for a bad mapping, before any byte moves (not counted as a failure).
        """
        with self._lock:
            blocks, n_runs = self._planner.plan(mapping)
            if blocks == 0:
                return _NOTHING_MOVED
            nbytes = blocks * self._bytes_per_block
            start = time.perf_counter_ns()
            try:
                self._copier.copy(self._planner, n_runs)
            except BaseException:
                report_failed(self.link, blocks, nbytes)
                raise
            seconds = (time.perf_counter_ns() - start) * 1e-9
        if self.link is not None:
            report_completed(self.link, blocks, nbytes, seconds)
        return TransferStats(blocks, nbytes, seconds)


def copy_blocks(
    src: PoolLike,
    dst: PoolLike,
    mapping: MappingLike,
    *,
    link: TransferLink | None = None,
) -> None:
    """Copy blocks ``src[s] -> dst[d]`` for each ``(s, d)`` in ``mapping`` and wait for them.

    One-shot form of ``BlockMover`` (host pools) and ``StreamMover`` (a pool on a GPU):
    it validates the pools on every call, so hot loops should keep a mover instead.

    Args:
        src: source pool, a ``[num_blocks, ...]`` tensor or a list of per-layer tensors.
        dst: destination pool, same layers, dtypes and block shapes as ``src``.
        mapping: ``(src_block_id, dst_block_id)`` pairs or an int64 tensor ``[N, 2]``.
        link: optional ``TransferLink``: ``completed(blocks, nbytes, seconds)`` on success,
            ``failed(blocks, nbytes)`` (then the error is re-raised) on failure.

    Raises:
        ValueError: duplicate destination ids, ids out of range, or a dtype, shape or layer
            mismatch between the pools; raised before any byte moves.

    Example:
        >>> import torch
        >>> gpu_like, host = torch.randn(16, 4096), torch.zeros(64, 4096)
        >>> copy_blocks(gpu_like, host, [(0, 10), (1, 11)])
        >>> bool((host[10:12] == gpu_like[:2]).all())
        True
    """
    src_pool, dst_pool = as_pool(src, "src"), as_pool(dst, "dst")
    if src_pool.device.type == "cpu" and dst_pool.device.type == "cpu":
        BlockMover(src_pool, dst_pool, link=link).copy(mapping)
        return
    from kvobs.kernels.stream_mover import StreamMover

    mover = StreamMover(src_pool, dst_pool, link=link)
    mover.submit(mapping)
    mover.synchronize()
