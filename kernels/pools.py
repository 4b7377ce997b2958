"""Block pools as the kernels see them: per-layer tensors indexed by block id on dim 0.

A pool is one tensor shaped ``[num_blocks, ...]`` or a sequence of such tensors, one per
layer (vLLM and SGLang keep one KV tensor per layer). Within a block the bytes must be
contiguous; blocks may sit at any stride. A layout whose block dimension is not first,
such as vLLM's ``[2, num_blocks, ...]`` K/V tensor, is passed as its views ``kv[0]`` and
``kv[1]``, one "layer" each.

Pools are validated once, when a mover is built; their memory must not be reallocated
(``resize_``, ``set_``) while a mover holds them, exactly like an engine's KV tensors.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

PoolLike = torch.Tensor | Sequence[torch.Tensor]


@dataclass(frozen=True)
class Pool:
    """A validated pool: its layers and the byte geometry of one block in each.

    Example:
        >>> pool = as_pool(torch.zeros(8, 16, 4), "src")
        >>> pool.num_blocks, pool.bytes_per_block
        (8, 256)
    """

    layers: tuple[torch.Tensor, ...]
    num_blocks: int
    device: torch.device
    block_bytes: tuple[int, ...]
    stride_bytes: tuple[int, ...]

    @property
    def bytes_per_block(self) -> int:
        """Bytes one block id covers across all layers."""
        return sum(self.block_bytes)

    def layer_span(self, index: int) -> tuple[int, int]:
        """The ``[start, end)`` address range layer ``index`` occupies (empty when no blocks)."""
        start = self.layers[index].data_ptr()
        if self.num_blocks == 0:
            return start, start
        return start, start + (self.num_blocks - 1) * self.stride_bytes[index] + self.block_bytes[
            index
        ]


def _block_is_contiguous(tensor: torch.Tensor) -> bool:
    expected = 1
    for size, stride in zip(reversed(tensor.shape[1:]), reversed(tensor.stride()[1:]), strict=True):
        if size != 1 and stride != expected:
            return False
        expected *= size
    return True


def _check_layer(tensor: object, where: str) -> torch.Tensor:
    if not isinstance(tensor, torch.Tensor):
        raise ValueError(f"{where}: expected a torch.Tensor, got {type(tensor).__name__}")
    if tensor.dim() < 1:
        raise ValueError(f"{where}: a pool tensor needs a block dimension; got a 0-d tensor")
    if tensor.device.type not in ("cpu", "cuda"):
        raise ValueError(f"{where}: device {tensor.device} is not supported; use cpu or cuda")
    if not _block_is_contiguous(tensor):
        raise ValueError(
            f"{where}: the bytes of one block are not contiguous (strides {tensor.stride()}); "
            "pass a tensor whose dims after the block dim are contiguous"
        )
    block_elems = math.prod(tensor.shape[1:])
    if tensor.shape[0] > 1 and tensor.stride(0) < block_elems:
        raise ValueError(
            f"{where}: blocks overlap (stride {tensor.stride(0)} < {block_elems} elements per "
            "block); pass a pool whose blocks do not share memory"
        )
    return tensor


def as_pool(pool: PoolLike | Pool, role: str) -> Pool:
    """Validate ``pool`` (a tensor or a sequence of per-layer tensors) and describe it.

    Args:
        pool: ``[num_blocks, ...]`` tensor or a non-empty sequence of them (a ``Pool``
            is returned as it is).
        role: ``"src"`` or ``"dst"``, used in error messages.

    Raises:
        ValueError: naming the layer and the problem.
    """
    if isinstance(pool, Pool):
        return pool
    layers = (pool,) if isinstance(pool, torch.Tensor) else tuple(pool)
    if not layers:
        raise ValueError(f"{role} pool: got an empty sequence; pass at least one layer tensor")
    checked = tuple(_check_layer(t, f"{role} pool layer {i}") for i, t in enumerate(layers))
    first = checked[0]
    for i, layer in enumerate(checked[1:], start=1):
        if layer.shape[0] != first.shape[0]:
            raise ValueError(
                f"{role} pool layer {i}: {layer.shape[0]} blocks but layer 0 has "
                f"{first.shape[0]}; every layer needs the same number of blocks"
            )
        if layer.device != first.device:
            raise ValueError(
                f"{role} pool layer {i}: on {layer.device} but layer 0 is on {first.device}; "
                "keep one pool on one device"
            )
    return Pool(
        layers=checked,
        num_blocks=int(first.shape[0]),
        device=first.device,
        block_bytes=tuple(math.prod(t.shape[1:]) * t.element_size() for t in checked),
        stride_bytes=tuple(t.stride(0) * t.element_size() for t in checked),
    )


def _first_overlap(spans: list[tuple[int, int, str]]) -> tuple[str, str] | None:
    ordered = sorted(s for s in spans if s[1] > s[0])
    for (_, end, name), (start, _, other) in itertools.pairwise(ordered):
        if start < end:
            return name, other
    return None


def _shared_memory(src: Pool, dst: Pool) -> tuple[str, str] | None:
    dst_spans = [(*dst.layer_span(i), f"dst layer {i}") for i in range(len(dst.layers))]
    clash = _first_overlap(dst_spans)
    if clash is not None:
        return clash
    ordered_dst = sorted(s for s in dst_spans if s[1] > s[0])
    starts = [s[0] for s in ordered_dst]
    for i in range(len(src.layers)):
        lo, hi = src.layer_span(i)
        if hi <= lo:
            continue
        # The dst span starting last before hi is the only candidate: dst spans are disjoint.
        k = bisect.bisect_left(starts, hi) - 1
        if k >= 0 and ordered_dst[k][1] > lo:
            return f"src layer {i}", ordered_dst[k][2]
    return None


def check_compatible(src: Pool, dst: Pool) -> None:
    """Check that blocks of ``src`` can be copied byte for byte into ``dst``.

    Raises:
        ValueError: on a layer count, dtype or block shape mismatch, or shared memory.
    """
    if len(src.layers) != len(dst.layers):
        raise ValueError(
            f"src pool has {len(src.layers)} layers but dst pool has {len(dst.layers)}; "
            "pass the same layers on both sides"
        )
    for i, (s, d) in enumerate(zip(src.layers, dst.layers, strict=True)):
        if s.dtype != d.dtype:
            raise ValueError(
                f"layer {i}: src dtype {s.dtype} differs from dst dtype {d.dtype}; "
                "both pools need the same dtype"
            )
        if s.shape[1:] != d.shape[1:]:
            raise ValueError(
                f"layer {i}: src block shape {tuple(s.shape[1:])} differs from dst block shape "
                f"{tuple(d.shape[1:])}; both pools need the same block layout"
            )
    clash = _shared_memory(src, dst) if src.device == dst.device else None
    if clash is not None:
        raise ValueError(
            f"{clash[0]} and {clash[1]} share memory; copies between overlapping pools "
            "depend on order, so pass pools backed by separate memory"
        )
