"""Move planned runs between host pools: one C loop, or a torch loop when it is not built.

The native route hands the C extension one table of per-layer addresses and strides and
the run buffer; it copies every run of every layer with ``memcpy`` (one call per run over
densely packed blocks) with the GIL released. The torch route issues one ``copy_`` per
run per layer; it is correct everywhere but pays torch's per-call cost for every run.
"""

from __future__ import annotations

import torch
from kvobs.kernels._ext import native as _native
from kvobs.kernels.pools import Pool

NATIVE_AVAILABLE = _native is not None


class HostCopier:
    """Copies runs of blocks between two validated host pools.

    Example:
        >>> from kvobs.kernels.pools import as_pool
        >>> src, dst = torch.arange(8.0).reshape(4, 2), torch.zeros(4, 2)
        >>> copier = HostCopier(as_pool(src, "src"), as_pool(dst, "dst"))
        >>> copier.copy(torch.tensor([[3, 0, 1]]))
        >>> dst[0].tolist()
        [6.0, 7.0]
    """

    def __init__(self, src: Pool, dst: Pool, *, native: bool = True) -> None:
        self.src = src
        self.dst = dst
        self.implementation = "native" if native and NATIVE_AVAILABLE else "torch"
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

    def copy(self, runs: torch.Tensor) -> None:
        """Copy every run ``(src, dst, count)`` of ``runs`` (an ``[n, 3]`` int64 tensor)."""
        if runs.shape[0] == 0:
            return
        if self.implementation == "native":
            assert _native is not None
            _native.copy_runs(
                self._table.data_ptr(), self._table.shape[0], runs.data_ptr(), runs.shape[0]
            )
            return
        with torch.no_grad():
            for s, d, n in runs.tolist():
                for src, dst in zip(self.src.layers, self.dst.layers, strict=True):
                    dst[d : d + n].copy_(src[s : s + n])
