"""Shared helpers for the kernel tests: pools and a reference copy (the oracle)."""

from __future__ import annotations

import torch


def filled_pool(
    num_blocks: int, block_shape: tuple[int, ...], dtype: torch.dtype, seed: int
) -> torch.Tensor:
    """A pool whose every byte is pseudo-random, so a misplaced byte cannot go unnoticed."""
    gen = torch.Generator().manual_seed(seed)
    raw = torch.randint(
        0,
        256,
        (
            num_blocks,
            *block_shape,
            torch.finfo(dtype).bits // 8
            if dtype.is_floating_point
            else torch.iinfo(dtype).bits // 8,
        ),
        dtype=torch.uint8,
        generator=gen,
    )
    return raw.view(dtype).reshape(num_blocks, *block_shape)


def reference_copy(
    src: list[torch.Tensor], dst: list[torch.Tensor], pairs: list[tuple[int, int]]
) -> list[torch.Tensor]:
    """What the destination must hold afterwards, computed block by block on clones."""
    expected = [d.clone() for d in dst]
    for s, d in pairs:
        for src_layer, out in zip(src, expected, strict=True):
            out[d] = src_layer[s]
    return expected


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Byte equality (NaN payloads included), not float equality."""
    return a.shape == b.shape and torch.equal(
        a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)
    )
