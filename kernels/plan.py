"""Validate a block mapping and coalesce it into runs, before any byte moves.

A mapping is a sequence of ``(src_block_id, dst_block_id)`` pairs or an integer tensor
shaped ``[N, 2]``. Planning checks every id against the pool sizes, rejects a destination
id used twice, and merges consecutive pairs ``(s, d), (s+1, d+1), ...`` into one run
``(s, d, count)`` so that a contiguous stretch costs one copy. Pairs are merged in the
order given; they are not reordered. One C loop does this over preallocated scratch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import torch

from kvobs.kernels._ext import native as _native

MappingLike = Sequence[Sequence[int]] | torch.Tensor

_STAMP_LIMIT = 2**32 - 1


class Plan(NamedTuple):
    """``blocks`` pairs coalesced into ``n_runs`` runs, held in the planner's run buffer."""

    blocks: int
    n_runs: int


def _pair_tensor(mapping: torch.Tensor) -> tuple[torch.Tensor, int]:
    """The mapping as a contiguous int64 CPU ``[N, 2]`` tensor, and N."""
    shape = mapping.shape
    if len(shape) == 2 and shape[1] == 2 and mapping.dtype is torch.int64 and mapping.is_cpu:
        return mapping.contiguous(), shape[0]
    if mapping.numel() == 0:
        return mapping.reshape(0, 2).to(torch.int64), 0
    if mapping.dim() != 2 or mapping.shape[1] != 2:
        raise ValueError(
            f"mapping: tensor shape {tuple(mapping.shape)} is not [N, 2]; "
            "pass one (src_block_id, dst_block_id) row per block"
        )
    if mapping.dtype.is_floating_point or mapping.dtype.is_complex or mapping.dtype == torch.bool:
        raise ValueError(f"mapping: dtype {mapping.dtype} is not an integer type; use torch.int64")
    if not mapping.is_cpu:
        raise ValueError(
            f"mapping: tensor is on {mapping.device}; pass block ids in host memory (a list or "
            "a CPU tensor) so that planning never waits on the device"
        )
    return mapping.to(torch.int64).contiguous(), shape[0]


class RunPlanner:
    """Plans copies between a source pool of ``src_blocks`` and a destination of ``dst_blocks``.

    Scratch (a duplicate-detection stamp per destination block and the run buffer) is
    allocated once and reused, so planning allocates nothing per call in steady state.
    The runs of the latest plan are ``runs(n_runs)``, or ``runs_addr`` for native code.

    Example:
        >>> planner = RunPlanner(src_blocks=8, dst_blocks=8)
        >>> plan = planner.plan([(0, 4), (1, 5), (6, 0)])
        >>> plan, planner.runs(plan.n_runs).tolist()
        (Plan(blocks=3, n_runs=2), [[0, 4, 2], [6, 0, 1]])
    """

    def __init__(self, src_blocks: int, dst_blocks: int) -> None:
        self.src_blocks = src_blocks
        self.dst_blocks = dst_blocks
        self._seen = torch.zeros(max(dst_blocks, 1), dtype=torch.int32)
        self._seen_addr = self._seen.data_ptr()
        self._stamp = 0
        self._capacity = 0
        self._runs = torch.empty(0, 3, dtype=torch.int64)
        self.runs_addr = self._runs.data_ptr()

    def runs(self, n_runs: int) -> torch.Tensor:
        """The ``[n_runs, 3]`` (src, dst, count) rows of the latest plan."""
        return self._runs[:n_runs]

    def plan(self, mapping: MappingLike) -> Plan:
        """Validate ``mapping`` and coalesce it into runs.

        Raises:
            ValueError: naming the offending pair for an id out of range, a repeated
                destination id, or a malformed mapping.
        """
        pairs: Any
        if isinstance(mapping, torch.Tensor):
            pairs, n = _pair_tensor(mapping)
        else:
            pairs = mapping
            try:
                n = len(pairs)
            except TypeError:
                raise ValueError(
                    f"mapping: {type(mapping).__name__} is not a sequence of "
                    "(src_block_id, dst_block_id) pairs or an [N, 2] tensor"
                ) from None
        if n == 0:
            return Plan(0, 0)
        if n > self.dst_blocks:
            raise ValueError(
                f"mapping: {n} pairs but the destination pool has {self.dst_blocks} blocks; "
                "a destination block may be written once per call"
            )
        if n > self._capacity:
            self._reserve(n)
        self._stamp += 1
        if self._stamp >= _STAMP_LIMIT:
            self._seen.zero_()
            self._stamp = 1
        if isinstance(pairs, torch.Tensor):
            n_runs = _native.plan_pairs(
                pairs.data_ptr(),
                n,
                self.src_blocks,
                self.dst_blocks,
                self._seen_addr,
                self._stamp,
                self.runs_addr,
            )
        else:
            n_runs = _native.plan_seq(
                pairs,
                self.src_blocks,
                self.dst_blocks,
                self._seen_addr,
                self._stamp,
                self.runs_addr,
            )
        return Plan(n, n_runs)

    def _reserve(self, n: int) -> None:
        self._capacity = min(self.dst_blocks, max(64, 1 << (n - 1).bit_length()))
        self._runs = torch.empty(self._capacity, 3, dtype=torch.int64)
        self.runs_addr = self._runs.data_ptr()
