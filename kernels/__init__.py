"""Block copies between KV cache tiers (shipped as ``kvobs.kernels``).

Move a batch of blocks between two pools given ``(src_block_id, dst_block_id)`` pairs:
GPU -> host (swap out), host -> GPU (swap in) and host <-> host. Pools are a tensor
``[num_blocks, ...]`` or a list of per-layer tensors. Contiguous runs are coalesced into
one copy each, a C loop (``kvobs.kernels._native``, built by ``pip install``) does the
host-side work, and every transfer is reported to a kvobs link with its blocks, bytes
and duration. ``BlockMover`` is synchronous (host pools, timed with ``perf_counter_ns``);
``StreamMover`` queues GPU transfers on a dedicated stream per direction, times them
with CUDA events and reports them from ``poll()`` without blocking the host. (The same
extension holds kvobs's other C kernels: see ``kvobs.kernels._ext``.)

Example:
    >>> import torch
    >>> from kvobs.kernels import BlockMover, copy_blocks
    >>> gpu_like, host = torch.randn(16, 16, 8), torch.zeros(64, 16, 8)
    >>> copy_blocks(gpu_like, host, [(0, 3), (1, 4)])
    >>> mover = BlockMover(host, gpu_like)          # reuse for repeated moves
    >>> mover.copy([(3, 8), (4, 9)]).blocks
    2
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvobs.kernels.link import TransferLink
    from kvobs.kernels.mover import BlockMover, TransferStats, copy_blocks
    from kvobs.kernels.stream_mover import StreamMover, Transfer

#: Where each public name lives. Loaded on first use, so that importing the package (as
#: ``kvobs.reuse`` does for the C extension, ``kvobs.kernels._ext``) needs no torch.
_PUBLIC = {
    "BlockMover": "kvobs.kernels.mover",
    "StreamMover": "kvobs.kernels.stream_mover",
    "Transfer": "kvobs.kernels.stream_mover",
    "TransferLink": "kvobs.kernels.link",
    "TransferStats": "kvobs.kernels.mover",
    "copy_blocks": "kvobs.kernels.mover",
}

__all__ = [
    "BlockMover",
    "StreamMover",
    "Transfer",
    "TransferLink",
    "TransferStats",
    "copy_blocks",
]


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'kvobs.kernels' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
