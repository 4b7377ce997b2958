"""Swap bandwidth: kvobs block moves against a per-block ``copy_`` loop and plain memcpy.

For each block size (64 KiB: Llama-3-8B, 16 tokens per block, one layer; and 4 KiB), each
batch size N and each pattern (random block ids, or one contiguous run), it times three
ways of moving the same bytes, interleaved round by round so that they share the noise
of the machine:

- ``kvobs``: ``BlockMover.copy`` (CPU) / ``StreamMover.submit`` (``--device cuda``),
  mapping validation and run planning included;
- ``copy_loop``: one ``dst[d].copy_(src[s])`` per block;
- ``memcpy``: one single-thread memcpy of the same number of bytes, contiguous (CPU), or
  one pinned ``cudaMemcpyAsync`` of them (``--device cuda``, each direction).

Usage:
    python benchmarks/swap_bandwidth.py            # table
    python benchmarks/swap_bandwidth.py --json     # the same rows as one JSON list
    python benchmarks/swap_bandwidth.py --device cuda
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

from kvobs.kernels import NATIVE_AVAILABLE, BlockMover
from kvobs.kernels._ext import native

# (label, per-block shape, dtype): 2 (K, V) x 16 tokens x 8 KV heads x 128 dims x fp16.
BLOCK_SHAPES = {
    65536: (2, 16, 8, 128),
    4096: (2, 16, 1, 64),
}
BATCH_SIZES = (1, 64, 256, 1024)
PATTERNS = ("random", "contiguous")
POOL_BLOCKS = 4096


@dataclass(frozen=True)
class Row:
    """One measurement; ``--json`` prints these fields (plus ``direction`` on CUDA)."""

    method: str
    pattern: str
    n_blocks: int
    block_bytes: int
    gbps: float
    ratio_to_memcpy: float


def block_ids(pattern: str, n: int, pool_blocks: int, rng: random.Random) -> list[int]:
    """``n`` distinct block ids: a random sample, or one run at a random start."""
    if pattern == "random":
        return rng.sample(range(pool_blocks), n)
    start = rng.randrange(pool_blocks - n + 1)
    return list(range(start, start + n))


def best_seconds(
    fns: dict[str, Callable[[], object]], rounds: int, budget_s: float
) -> dict[str, float]:
    """Per-call time, best of ``rounds``; each round runs every method for about ``budget_s``.

    Methods alternate round by round so that each sees the same machine; the best round
    is the one least disturbed by other work (this machine is shared and noisy).
    """
    reps = {}
    for name, fn in fns.items():
        fn()
        start = time.perf_counter()
        fn()
        reps[name] = max(1, min(2000, int(budget_s / max(time.perf_counter() - start, 1e-7))))
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            start = time.perf_counter_ns()
            for _ in range(reps[name]):
                fn()
            samples[name].append((time.perf_counter_ns() - start) * 1e-9 / reps[name])
    return {name: min(s) for name, s in samples.items()}


def block_mapping(
    pattern: str, n: int, rng: random.Random
) -> tuple[list[tuple[int, int]], torch.Tensor]:
    """``n`` (src, dst) pairs of ``pattern`` as a list and as an int64 ``[n, 2]`` tensor."""
    pairs = list(
        zip(
            block_ids(pattern, n, POOL_BLOCKS, rng),
            block_ids(pattern, n, POOL_BLOCKS, rng),
            strict=True,
        )
    )
    return pairs, torch.tensor(pairs, dtype=torch.int64)


def cpu_methods(
    src: torch.Tensor, dst: torch.Tensor, pattern: str, n: int, rng: random.Random
) -> dict[str, Callable[[], object]]:
    """The three CPU contenders for one (pattern, N) point over two pools."""
    block_bytes = src[0].numel() * src.element_size()
    pairs, mapping = block_mapping(pattern, n, rng)
    mover = BlockMover(src, dst)
    nbytes = n * block_bytes
    src_addr, dst_addr = src.data_ptr(), dst.data_ptr()

    def copy_loop() -> None:
        for s, d in pairs:
            dst[d].copy_(src[s])

    def memcpy() -> None:
        assert native is not None
        native.memcpy(dst_addr, src_addr, nbytes)

    return {"kvobs": lambda: mover.copy(mapping), "copy_loop": copy_loop, "memcpy": memcpy}


def run_cpu(rounds: int, budget_s: float, seed: int) -> list[Row]:
    """Measure every CPU point; memcpy bandwidth is the denominator of each ratio."""
    if native is None:
        sys.exit("the C extension is not built: reinstall with `pip install -e .` and a C compiler")
    rng = random.Random(seed)
    rows = []
    for block_bytes, shape in BLOCK_SHAPES.items():
        # ones(), not empty(): every page is touched before anything is timed.
        src = torch.ones(POOL_BLOCKS, *shape, dtype=torch.float16)
        dst = torch.ones(POOL_BLOCKS, *shape, dtype=torch.float16)
        for pattern in PATTERNS:
            for n in BATCH_SIZES:
                seconds = best_seconds(cpu_methods(src, dst, pattern, n, rng), rounds, budget_s)
                rows += to_rows(seconds, pattern, n, block_bytes)
    return rows


@dataclass(frozen=True)
class CudaRow(Row):
    """A GPU measurement: ``direction`` is ``d2h`` (swap out) or ``h2d`` (swap in)."""

    direction: str = ""


def to_rows(
    seconds: dict[str, float], pattern: str, n: int, block_bytes: int, direction: str = ""
) -> list[Row]:
    """GB/s per method and its ratio to the memcpy of the same bytes."""
    gbps = {name: n * block_bytes / s / 1e9 for name, s in seconds.items()}
    return [
        CudaRow(name, pattern, n, block_bytes, round(g, 3), round(g / gbps["memcpy"], 3), direction)
        if direction
        else Row(name, pattern, n, block_bytes, round(g, 3), round(g / gbps["memcpy"], 3))
        for name, g in gbps.items()
    ]


def cuda_methods(
    src: torch.Tensor, dst: torch.Tensor, pattern: str, n: int, rng: random.Random
) -> dict[str, Callable[[], object]]:
    """GPU contenders; each call ends with a device sync so wall time is transfer time."""
    from kvobs.kernels import StreamMover

    block_bytes = src[0].numel() * src.element_size()
    pairs, mapping = block_mapping(pattern, n, rng)
    mover = StreamMover(src, dst)
    side = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    flat_src, flat_dst = src.view(-1).view(torch.uint8), dst.view(-1).view(torch.uint8)
    nbytes = n * block_bytes

    def kvobs() -> None:
        mover.submit(mapping)
        mover.synchronize()

    def copy_loop() -> None:
        with torch.cuda.stream(side):
            for s, d in pairs:
                dst[d].copy_(src[s], non_blocking=True)
        side.synchronize()

    def memcpy() -> None:  # one pinned cudaMemcpyAsync of the same bytes
        with torch.cuda.stream(side):
            flat_dst[:nbytes].copy_(flat_src[:nbytes], non_blocking=True)
        side.synchronize()

    return {"kvobs": kvobs, "copy_loop": copy_loop, "memcpy": memcpy}


def run_cuda(rounds: int, budget_s: float, seed: int) -> list[Row]:
    """Swap out (GPU -> pinned host) and swap in (pinned host -> GPU) at every point."""
    if not torch.cuda.is_available():
        sys.exit("--device cuda needs a CUDA build of torch and a visible GPU")
    rng = random.Random(seed)
    rows: list[Row] = []
    for block_bytes, shape in BLOCK_SHAPES.items():
        gpu = torch.ones(POOL_BLOCKS, *shape, dtype=torch.float16, device="cuda")
        host = torch.ones(POOL_BLOCKS, *shape, dtype=torch.float16, pin_memory=True)
        for direction, (src, dst) in (("d2h", (gpu, host)), ("h2d", (host, gpu))):
            for pattern in PATTERNS:
                for n in BATCH_SIZES:
                    methods = cuda_methods(src, dst, pattern, n, rng)
                    seconds = best_seconds(methods, rounds, budget_s)
                    rows += to_rows(seconds, pattern, n, block_bytes, direction)
    return rows


def print_table(rows: list[Row], extra: str = "") -> None:
    """A fixed-width table with one line per point and the three methods side by side."""
    print(f"kvobs swap bandwidth {extra}(native extension: {NATIVE_AVAILABLE}, threads: 1)")
    print(
        f"{'block':>6} {'pattern':>10} {'N':>5} | {'kvobs GB/s':>10} {'copy_ loop':>10} "
        f"{'memcpy':>8} | {'kvobs/memcpy':>12} {'loop/memcpy':>11} | {'kvobs us':>9}"
    )
    points: dict[tuple[str, int, int, str], dict[str, Row]] = {}
    for row in rows:
        key = (getattr(row, "direction", ""), row.block_bytes, row.n_blocks, row.pattern)
        points.setdefault(key, {})[row.method] = row
    for (direction, block_bytes, n, pattern), by in points.items():
        k, loop, mem = by["kvobs"], by["copy_loop"], by["memcpy"]
        micros = n * block_bytes / (k.gbps * 1e9) * 1e6
        print(
            f"{block_bytes // 1024:>4}Ki {pattern:>10} {n:>5} | {k.gbps:>10.2f} {loop.gbps:>10.2f} "
            f"{mem.gbps:>8.2f} | {k.ratio_to_memcpy:>12.2f} {loop.ratio_to_memcpy:>11.2f} | "
            f"{micros:>9.1f}" + (f"  {direction}" if direction else "")
        )


def main(argv: list[str] | None = None) -> None:
    """Parse arguments, run the CPU or CUDA benchmark, print a table or JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print rows as one JSON list")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--rounds", type=int, default=15, help="rounds per point (best of)")
    parser.add_argument("--budget-ms", type=float, default=5.0, help="time per method per round")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.device == "cuda":
        rows: list[Row] = run_cuda(args.rounds, args.budget_ms / 1e3, args.seed)
    else:
        rows = run_cpu(args.rounds, args.budget_ms / 1e3, args.seed)
    if args.json:
        print(json.dumps([asdict(r) for r in rows]))
    else:
        print_table(rows, "" if args.device == "cpu" else "cuda ")


if __name__ == "__main__":
    main()
