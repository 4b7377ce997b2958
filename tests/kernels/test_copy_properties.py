"""Byte-exact block moves for random mappings, layouts and implementations."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvobs.kernels import BlockMover, copy_blocks
from kvobs.kernels.plan import MappingLike
from tests.kernels.kernel_helpers import filled_pool, reference_copy, same_bytes

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.int8]
Case = tuple[list[torch.Tensor], list[torch.Tensor], list[tuple[int, int]]]


@st.composite
def pools_and_mapping(draw: st.DrawFn) -> Case:
    layers = draw(st.integers(1, 3))
    src_blocks, dst_blocks = draw(st.integers(1, 40)), draw(st.integers(1, 40))
    block_shape = tuple(draw(st.lists(st.integers(1, 5), min_size=1, max_size=3)))
    dtype = draw(st.sampled_from(DTYPES))
    seed = draw(st.integers(0, 2**16))
    src = [filled_pool(src_blocks, block_shape, dtype, seed + i) for i in range(layers)]
    dst = [filled_pool(dst_blocks, block_shape, dtype, seed + 100 + i) for i in range(layers)]
    n = draw(st.integers(0, min(src_blocks, dst_blocks)))
    dst_ids = draw(st.permutations(range(dst_blocks)))[:n]
    if draw(st.booleans()):  # runs: consecutive ids on both sides, coalesced by the planner
        start = draw(st.integers(0, src_blocks - n))
        src_ids = list(range(start, start + n))
        dst_start = draw(st.integers(0, dst_blocks - n))
        dst_ids = list(range(dst_start, dst_start + n))
    else:
        src_ids = [draw(st.integers(0, src_blocks - 1)) for _ in range(n)]  # repeats allowed
    return src, dst, list(zip(src_ids, dst_ids, strict=True))


@pytest.mark.parametrize("stream_bytes", [-1, 0], ids=["cached-stores", "streaming-stores"])
@settings(max_examples=50, deadline=None)
@given(case=pools_and_mapping(), as_tensor=st.booleans())
def test_random_mappings_are_byte_exact(
    case: Case, as_tensor: bool, stream_bytes: int
) -> None:
    src, dst, pairs = case
    expected = reference_copy(src, dst, pairs)
    mover = BlockMover(src, dst, stream_bytes=stream_bytes)
    mapping = torch.tensor(pairs, dtype=torch.int64).reshape(-1, 2) if as_tensor else pairs
    stats = mover.copy(mapping)
    assert all(same_bytes(d, e) for d, e in zip(dst, expected, strict=True))
    assert stats.blocks == len(pairs)
    assert stats.nbytes == len(pairs) * sum(t[0].numel() * t.element_size() for t in src)


@pytest.mark.parametrize("offset", [0, 1, 3, 8, 17])
def test_streaming_stores_handle_unaligned_blocks(offset: int) -> None:
    # Blocks of 1000 bytes starting at odd addresses: head, 64-byte body and tail paths.
    raw_src = filled_pool(1, (20 * 1000 + 32,), torch.uint8, 5)[0]
    raw_dst = torch.zeros(20 * 1000 + 32, dtype=torch.uint8)
    src = raw_src[offset : offset + 20 * 1000].view(20, 1000)
    dst = raw_dst[32 - offset : 32 - offset + 20 * 1000].view(20, 1000)
    pairs = [(i, 19 - i) for i in range(20)]
    expected = reference_copy([src], [dst], pairs)[0]
    BlockMover(src, dst, stream_bytes=0).copy(pairs)
    assert same_bytes(dst, expected)
    assert not raw_dst[: 32 - offset].any() and not raw_dst[32 - offset + 20 * 1000 :].any()


def test_strided_kv_planes_of_one_tensor_per_layer() -> None:
    # vLLM keeps K and V in one [2, num_blocks, ...] tensor per layer: pass kv[0], kv[1].
    gpu_like = [
        filled_pool(2 * 12, (4, 2, 8), torch.float16, i).view(2, 12, 4, 2, 8) for i in range(3)
    ]
    host = [torch.zeros(2, 20, 4, 2, 8, dtype=torch.float16) for _ in range(3)]
    src = [plane for kv in gpu_like for plane in (kv[0], kv[1])]
    dst = [plane for kv in host for plane in (kv[0], kv[1])]
    pairs = [(0, 19), (1, 0), (2, 1), (11, 7)]
    expected = reference_copy(src, dst, pairs)
    BlockMover(src, dst).copy(pairs)
    assert all(same_bytes(d, e) for d, e in zip(dst, expected, strict=True))
    assert not host[0][0, 2:7].any()  # untouched blocks stay untouched


def test_empty_mapping_is_a_no_op() -> None:
    src, dst = filled_pool(4, (8,), torch.float16, 1), filled_pool(4, (8,), torch.float16, 2)
    before = dst.clone()
    empties: list[MappingLike] = [[], (), torch.empty(0, 2, dtype=torch.int64), torch.empty(0)]
    for empty in empties:
        stats = BlockMover(src, dst).copy(empty)
        assert (stats.blocks, stats.nbytes) == (0, 0)
    assert same_bytes(dst, before)


def test_swap_out_then_in_round_trips() -> None:
    gpu_like = filled_pool(32, (16, 8, 16), torch.bfloat16, 7)
    host = torch.zeros(64, 16, 8, 16, dtype=torch.bfloat16)
    original = gpu_like.clone()
    copy_blocks(gpu_like, host, [(i, 63 - i) for i in range(32)])
    gpu_like.zero_()
    copy_blocks(host, gpu_like, torch.tensor([[63 - i, i] for i in range(32)]))
    assert same_bytes(gpu_like, original)


def test_reused_mover_detects_duplicates_only_within_one_call() -> None:
    src, dst = filled_pool(8, (4,), torch.float32, 3), torch.zeros(8, 4)
    mover = BlockMover(src, dst)
    for _ in range(3):  # the same destination ids are fine across calls
        mover.copy([(0, 1), (2, 3)])
    assert same_bytes(dst[3], src[2])
