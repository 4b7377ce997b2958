"""Bad input: a one-line ValueError naming the field, raised before any byte moves."""

from __future__ import annotations

import pytest
import torch

from kvobs.kernels import BlockMover, copy_blocks
from kvobs.recorder import Recorder
from tests.kernels.kernel_helpers import filled_pool, same_bytes


def pools() -> tuple[torch.Tensor, torch.Tensor]:
    return filled_pool(8, (4, 2), torch.float16, 1), filled_pool(6, (4, 2), torch.float16, 2)


BAD_MAPPINGS = [
    ([(0, 1), (2, 1)], r"mapping\[1\]: destination block id 1 appears twice"),
    (torch.tensor([[0, 5], [1, 5]]), r"mapping\[1\]: destination block id 5 appears twice"),
    ([(8, 0)], r"mapping\[0\]: source block id 8 is out of range \[0, 8\)"),
    ([(1, 0), (-1, 2)], r"mapping\[1\]: source block id -1 is out of range"),
    (torch.tensor([[0, 6]]), r"mapping\[0\]: destination block id 6 is out of range \[0, 6\)"),
    ([(0, 0), (1,)], r"mapping\[1\]: expected a \(src_block_id, dst_block_id\) pair"),
    ([(0, 0), (1, 2, 3)], r"mapping\[1\]: expected a \(src_block_id, dst_block_id\) pair"),
    ([(0, 1.5)], r"mapping\[0\]: .*(integers|pair)"),
    ([(0, 1), None], r"mapping\[1\]: expected a \(src_block_id, dst_block_id\) pair"),
    (7, r"mapping: int is not a sequence"),
    (torch.zeros(3, 3, dtype=torch.int64), r"mapping: tensor shape \(3, 3\) is not \[N, 2\]"),
    (torch.zeros(2, 2), r"mapping: dtype torch.float32 is not an integer type"),
    ([(i, i) for i in range(7)], r"mapping: 7 pairs but the destination pool has 6 blocks"),
]


@pytest.mark.parametrize(("mapping", "message"), BAD_MAPPINGS)
def test_bad_mapping_raises_before_any_byte_moves(
    mapping: object, message: str
) -> None:
    src, dst = pools()
    before = dst.clone()
    link = Recorder(engine="test", model="m").link("gpu", "host")
    mover = BlockMover(src, dst, link=link)
    with pytest.raises(ValueError, match=message):
        mover.copy(mapping)
    assert same_bytes(dst, before)
    assert (link.operations, link.failures) == (0, 0)  # validation is not a failed transfer
    mover.copy([(0, 0), (1, 1)])  # and the mover is still usable afterwards
    assert same_bytes(dst[:2], src[:2])


def test_copy_blocks_validates_pairs_too() -> None:
    src, dst = pools()
    before = dst.clone()
    with pytest.raises(ValueError, match="appears twice"):
        copy_blocks(src, dst, [(3, 2), (4, 2)])
    assert same_bytes(dst, before)


BAD_POOLS = [
    (lambda s, d: (s, d.to(torch.float32)), r"layer 0: src dtype torch.float16 differs from dst"),
    (lambda s, d: (s, d.reshape(6, 8)), r"layer 0: src block shape \(4, 2\) differs from dst"),
    (lambda s, d: ([s, s.clone()], [d]), r"src pool has 2 layers but dst pool has 1"),
    (lambda s, d: ([s, s[:4]], [d, d]), r"src pool layer 1: 4 blocks but layer 0 has 8"),
    (lambda s, d: (s, []), r"dst pool: got an empty sequence"),
    (lambda s, d: (s, [d, "layer"]), r"dst pool layer 1: expected a torch.Tensor, got str"),
    (lambda s, d: (s, torch.tensor(1.0)), r"dst pool layer 0: a pool tensor needs a block dim"),
    (
        lambda s, d: (s.transpose(1, 2), d.transpose(1, 2)),
        r"src pool layer 0: the bytes of one block are not contiguous",
    ),
    (lambda s, d: (s, d[:1].expand(6, 4, 2)), r"dst pool layer 0: blocks overlap"),
    (lambda s, d: (s, s), r"dst layer 0 and src layer 0 share memory|src layer 0 and dst layer 0"),
    (lambda s, d: (s[2:], s[:6]), r"share memory"),
    (lambda s, d: ([s, s], [d, d]), r"dst layer 0 and dst layer 1 share memory"),
    (
        lambda s, d: (s, torch.empty(6, 4, 2, dtype=torch.float16, device="meta")),
        r"dst pool layer 0: device meta is not supported; use cpu or cuda",
    ),
]


@pytest.mark.parametrize(("make", "message"), BAD_POOLS)
def test_bad_pools_raise_a_clear_error(make: object, message: str) -> None:
    src, dst = pools()
    before = dst.clone()
    bad_src, bad_dst = make(src, dst)  # type: ignore[operator]
    with pytest.raises(ValueError, match=message):
        BlockMover(bad_src, bad_dst)
    with pytest.raises(ValueError, match=message):
        copy_blocks(bad_src, bad_dst, [(0, 0)])
    assert same_bytes(dst, before)


def test_read_only_sharing_between_source_layers_is_allowed() -> None:
    src, dst = pools()
    other = torch.zeros_like(dst)
    BlockMover([src, src], [dst, other]).copy([(7, 0)])
    assert same_bytes(dst[0], src[7]) and same_bytes(other[0], src[7])
