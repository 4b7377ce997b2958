"""Move planned runs between host pools in one C loop.

The C extension gets one table of per-layer addresses and strides and the run buffer; it
copies every run of every layer with ``memcpy`` (one call per run over densely packed
blocks) with the GIL released.
"""

from __future__ import annotations

import torch

from kvobs.kernels._ext import native as _native
from kvobs.kernels.plan import RunPlanner
from kvobs.kernels.pools import Pool

# A call moving at least this many bytes uses non-temporal stores (see copy.c); -1
# never does. Half of a typical last-level cache: a smaller batch may be read back from
# cache soon after; a larger one would mostly be evicted first, so it skips the cache.
# (glibc's memcpy switches at 3/4 of the LLC size it detects, which in VMs is often the
# host's and far too large: measured here, 4-16 MiB memcpy ran at 6 GB/s, streaming at 12.)
STREAM_BYTES = 4 << 20


class HostCopier:
    """Copies runs of blocks between two validated host pools.

    Example:
        >>> from kvobs.kernels.pools import as_pool
        >>> src, dst = torch.arange(8.0).reshape(4, 2), torch.zeros(4, 2)
        >>> copier = HostCopier(as_pool(src, "src"), as_pool(dst, "dst"))
        >>> planner = RunPlanner(4, 4)
        >>> copier.copy(planner, planner.plan([(3, 0)]).n_runs)
        >>> dst[0].tolist()
        [6.0, 7.0]
    """

    def __init__(self, src: Pool, dst: Pool, *, stream_bytes: int = STREAM_BYTES) -> None:
        self.src = src
        self.dst = dst
        self.stream_bytes = stream_bytes
        self._table = torch.tensor(
            [
                [d.data_ptr(), s.data_ptr(), dst_stride, src_stride, block]
                for s, d, src_stride, dst_stride, block in zip(
                    src.layers,
                    dst.layers,
                    src.stride_bytes,
                    dst.stride_bytes,
                    src.block_bytes,
                    strict=True,
                )
            ],
            dtype=torch.int64,
        )
        self._table_addr = self._table.data_ptr()
        self._n_layers = len(src.layers)

    def copy(self, planner: RunPlanner, n_runs: int) -> None:
        """Copy the ``n_runs`` runs of ``planner``'s latest plan, every layer."""
        if n_runs == 0:
            return
        _native.copy_runs(
            self._table_addr, self._n_layers, planner.runs_addr, n_runs, self.stream_bytes
        )
