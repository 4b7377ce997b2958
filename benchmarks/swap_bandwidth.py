"""Swap bandwidth: kvobs block moves against a per-block ``copy_`` loop and plain memcpy.

For each block size (64 KiB: Llama-3-8B, 16 tokens per block, one layer; and 4 KiB), each
batch size N and each pattern (random block ids, or one contiguous run), it times three
ways of moving the same bytes, interleaved so that they share the noise of the machine:

- ``kvobs``: ``BlockMover.copy`` (CPU) / ``StreamMover.submit`` (``--device cuda``),
  mapping validation and run planning included;
- ``copy_loop``: one ``dst[d].copy_(src[s])`` per block;
- ``memcpy``: one single-thread memcpy of the same number of bytes, contiguous (CPU), or
  one pinned ``cudaMemcpyAsync`` of them (``--device cuda``, each direction).

On CPU each point is measured twice (``--cache``):

- ``cold`` (what a swap sees): pools several times the last-level cache, and every
  repetition takes blocks no repetition touched since the whole pool was swept (a fresh
  random mapping drawn from a shuffled sweep of its own third of the pool), so the bytes
  come from DRAM. The memcpy baseline copies equally cold bytes: the next contiguous
  stretch of its third. Each call is timed once; the figure is the median over repetitions.
- ``hot``: the same mapping and the same 4 MiB-ish buffers on every repetition, so the
  bytes (or most of them) come from cache; best of ``--rounds``. A ratio against an
  in-cache memcpy swings with what the cache holds (0.66x to 1.27x between two runs on
  one machine before): read the cold figure.

Usage:
    python benchmarks/swap_bandwidth.py            # table, cold and hot
    python benchmarks/swap_bandwidth.py --cache cold --json
    python benchmarks/swap_bandwidth.py --device cuda
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from kvobs.kernels import BlockMover
from kvobs.kernels._ext import native

# (label, per-block shape, dtype): 2 (K, V) x 16 tokens x 8 KV heads x 128 dims x fp16.
BLOCK_SHAPES = {
    65536: (2, 16, 8, 128),
    4096: (2, 16, 1, 64),
}
BATCH_SIZES = (1, 64, 256, 1024)
PATTERNS = ("random", "contiguous")
POOL_BLOCKS = 4096  # hot runs and CUDA


@dataclass(frozen=True)
class Row:
    """One measurement; ``--json`` prints these fields (plus ``direction`` on CUDA)."""

    method: str
    pattern: str
    n_blocks: int
    block_bytes: int
    gbps: float
    ratio_to_memcpy: float
    cache: str = "hot"


def last_level_cache_bytes() -> int:
    """The largest CPU cache the kernel reports (0 when unknown)."""
    sizes = []
    for path in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        text = path.read_text().strip()
        scale = {"K": 1 << 10, "M": 1 << 20}.get(text[-1:], 1)
        sizes.append(int(text.rstrip("KM")) * scale)
    return max(sizes, default=0)


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
    """The three CPU contenders for one hot (pattern, N) point over two pools."""
    block_bytes = src[0].numel() * src.element_size()
    pairs, mapping = block_mapping(pattern, n, rng)
    mover = BlockMover(src, dst)
    nbytes = n * block_bytes
    src_addr, dst_addr = src.data_ptr(), dst.data_ptr()

    def copy_loop() -> None:
        for s, d in pairs:
            dst[d].copy_(src[s])

    def memcpy() -> None:
        native.memcpy(dst_addr, src_addr, nbytes)

    return {"kvobs": lambda: mover.copy(mapping), "copy_loop": copy_loop, "memcpy": memcpy}


class ColdSweep:
    """Hands out block ids of ``[lo, hi)`` that no call touched since the range was swept.

    Random: a shuffled permutation of the range consumed in order (reshuffled per sweep).
    Contiguous: consecutive runs, wrapping. A block comes back only after every other
    block of the range was used. Each method sweeps its own third of the pools, so
    between two uses of a block the whole pool (several times the cache) went by.
    """

    def __init__(self, lo: int, hi: int, pattern: str, seed: int) -> None:
        self.lo, self.hi, self.pattern = lo, hi, pattern
        self._gen = torch.Generator().manual_seed(seed)
        self._order = self._shuffle()
        self._next = 0

    def _shuffle(self) -> torch.Tensor:
        return torch.randperm(self.hi - self.lo, generator=self._gen) + self.lo

    def take(self, n: int) -> torch.Tensor:
        if self._next + n > self.hi - self.lo:
            self._next = 0
            if self.pattern == "random":
                self._order = self._shuffle()
        if self.pattern == "contiguous":
            ids = torch.arange(self._next, self._next + n, dtype=torch.int64) + self.lo
        else:
            ids = self._order[self._next : self._next + n]
        self._next += n
        return ids


COLD_METHODS = ("kvobs", "copy_loop", "memcpy")


def cold_point(
    src: torch.Tensor, dst: torch.Tensor, pattern: str, n: int, reps: int, seed: int
) -> dict[str, float]:
    """Median seconds per call of each method, every call on cold blocks."""
    third = src.shape[0] // len(COLD_METHODS)
    block_bytes = src[0].numel() * src.element_size()
    nbytes = n * block_bytes
    mover = BlockMover(src, dst)
    sweeps = {
        name: (ColdSweep(i * third, (i + 1) * third, pattern, seed * 31 + 2 * i),
               ColdSweep(i * third, (i + 1) * third, pattern, seed * 31 + 2 * i + 1))
        for i, name in enumerate(COLD_METHODS)
    }
    # memcpy: the next contiguous stretch of its third of the pools (equally cold bytes).
    flat = (ColdSweep(2 * third, 3 * third, "contiguous", 0),
            ColdSweep(2 * third, 3 * third, "contiguous", 0))
    src_addr, dst_addr = src.data_ptr(), dst.data_ptr()
    samples: dict[str, list[float]] = {name: [] for name in COLD_METHODS}
    for _ in range(reps):
        src_ids, dst_ids = sweeps["kvobs"][0].take(n), sweeps["kvobs"][1].take(n)
        mapping = torch.stack((src_ids, dst_ids), dim=1).contiguous()
        start = time.perf_counter_ns()
        mover.copy(mapping)
        samples["kvobs"].append((time.perf_counter_ns() - start) * 1e-9)

        pairs = list(zip(sweeps["copy_loop"][0].take(n).tolist(),
                         sweeps["copy_loop"][1].take(n).tolist(), strict=True))
        start = time.perf_counter_ns()
        for s, d in pairs:
            dst[d].copy_(src[s])
        samples["copy_loop"].append((time.perf_counter_ns() - start) * 1e-9)

        s0, d0 = int(flat[0].take(n)[0]), int(flat[1].take(n)[0])
        start = time.perf_counter_ns()
        native.memcpy(dst_addr + d0 * block_bytes, src_addr + s0 * block_bytes, nbytes)
        samples["memcpy"].append((time.perf_counter_ns() - start) * 1e-9)
    return {name: statistics.median(times) for name, times in samples.items()}


def run_cpu(rounds: int, budget_s: float, seed: int, cache: str, pool_mib: int) -> list[Row]:
    """Measure every CPU point; memcpy bandwidth is the denominator of each ratio."""
    rng = random.Random(seed)
    rows = []
    for block_bytes, shape in BLOCK_SHAPES.items():
        if cache in ("cold", "both"):
            blocks = pool_mib * 2**20 // block_bytes
            # ones(), not empty(): every page is touched before anything is timed.
            src = torch.ones(blocks, *shape, dtype=torch.float16)
            dst = torch.ones(blocks, *shape, dtype=torch.float16)
            for pattern in PATTERNS:
                for n in BATCH_SIZES:
                    reps = max(rounds * 8, 40)
                    seconds = cold_point(src, dst, pattern, n, reps, seed)
                    rows += to_rows(seconds, pattern, n, block_bytes, cache="cold")
            del src, dst
        if cache in ("hot", "both"):
            src = torch.ones(POOL_BLOCKS, *shape, dtype=torch.float16)
            dst = torch.ones(POOL_BLOCKS, *shape, dtype=torch.float16)
            for pattern in PATTERNS:
                for n in BATCH_SIZES:
                    seconds = best_seconds(cpu_methods(src, dst, pattern, n, rng), rounds,
                                           budget_s)
                    rows += to_rows(seconds, pattern, n, block_bytes)
    return rows


@dataclass(frozen=True)
class CudaRow(Row):
    """A GPU measurement: ``direction`` is ``d2h`` (swap out) or ``h2d`` (swap in)."""

    direction: str = ""


def to_rows(
    seconds: dict[str, float], pattern: str, n: int, block_bytes: int, direction: str = "",
    cache: str = "hot",
) -> list[Row]:
    """GB/s per method and its ratio to the memcpy of the same bytes."""
    gbps = {name: n * block_bytes / s / 1e9 for name, s in seconds.items()}
    return [
        CudaRow(name, pattern, n, block_bytes, round(g, 3), round(g / gbps["memcpy"], 3),
                cache, direction)
        if direction
        else Row(name, pattern, n, block_bytes, round(g, 3), round(g / gbps["memcpy"], 3), cache)
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
    print(f"kvobs swap bandwidth {extra}(threads: 1)")
    print(
        f"{'block':>6} {'pattern':>10} {'N':>5} | {'kvobs GB/s':>10} {'copy_ loop':>10} "
        f"{'memcpy':>8} | {'kvobs/memcpy':>12} {'loop/memcpy':>11} | {'kvobs us':>9}"
    )
    points: dict[tuple[str, str, int, int, str], dict[str, Row]] = {}
    for row in rows:
        key = (row.cache, getattr(row, "direction", ""), row.block_bytes, row.n_blocks,
               row.pattern)
        points.setdefault(key, {})[row.method] = row
    for (cache, direction, block_bytes, n, pattern), by in points.items():
        k, loop, mem = by["kvobs"], by["copy_loop"], by["memcpy"]
        micros = n * block_bytes / (k.gbps * 1e9) * 1e6
        print(
            f"{block_bytes // 1024:>4}Ki {pattern:>10} {n:>5} | {k.gbps:>10.2f} {loop.gbps:>10.2f} "
            f"{mem.gbps:>8.2f} | {k.ratio_to_memcpy:>12.2f} {loop.ratio_to_memcpy:>11.2f} | "
            f"{micros:>9.1f}  {cache}" + (f"  {direction}" if direction else "")
        )


def main(argv: list[str] | None = None) -> None:
    """Parse arguments, run the CPU or CUDA benchmark, print a table or JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print rows as one JSON list")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--rounds", type=int, default=15, help="rounds per point (best of)")
    parser.add_argument("--budget-ms", type=float, default=5.0, help="time per method per round")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache", choices=("cold", "hot", "both"), default="both",
                        help="CPU: cold pools larger than the last-level cache, hot buffers, "
                             "or both")
    llc = last_level_cache_bytes()
    default_pool = max(512, min(2048, 4 * llc >> 20))
    parser.add_argument("--pool-mib", type=int, default=default_pool,
                        help=f"CPU cold runs: MiB per pool (default 4x the last-level cache "
                             f"of {llc >> 20} MiB, 512-2048: {default_pool})")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.budget_ms <= 0 or args.pool_mib < 64:
        parser.error("--rounds must be >= 1, --budget-ms > 0 and --pool-mib >= 64")
    torch.set_num_threads(1)
    if args.device == "cuda":
        rows: list[Row] = run_cuda(args.rounds, args.budget_ms / 1e3, args.seed)
    else:
        print(f"pools for cold runs: {args.pool_mib} MiB each; last-level cache "
              f"{llc >> 20} MiB", file=sys.stderr)
        rows = run_cpu(args.rounds, args.budget_ms / 1e3, args.seed, args.cache,
                       args.pool_mib)
    if args.json:
        print(json.dumps([asdict(r) for r in rows]))
    else:
        print_table(rows, "" if args.device == "cpu" else "cuda ")


if __name__ == "__main__":
    main()
