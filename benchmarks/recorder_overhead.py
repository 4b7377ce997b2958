"""Cost of one recorder event next to a bare counter increment, measured in one run.

Each figure is the median over interleaved repeats of a loop of N calls, minus the cost
of the empty loop, so the ratio compares like with like on a noisy 2-core machine.

    python benchmarks/recorder_overhead.py            # table
    python benchmarks/recorder_overhead.py --json     # machine-readable
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

from kvobs.recorder import Recorder


class _Bare:
    __slots__ = ("count",)

    def __init__(self) -> None:
        self.count = 0


def _loops(n: int) -> dict[str, Callable[[], None]]:
    rec = Recorder()
    gpu = rec.add_tier("gpu", capacity_blocks=1 << 30, block_tokens=16, block_bytes=1)
    host = rec.add_tier("host", capacity_blocks=1 << 30, block_tokens=16, block_bytes=1)
    link = rec.link("gpu", "host")
    # a completed offload of 3 chunks (vLLM's mean in the scheduler benchmark) keyed by
    # 36-byte digests, 1,024 batches re-offloaded in turn: the thrash core and the residency
    # sampler see every key, their tables stay warm (in an engine's step they are not)
    batches = [[(i * 3 + j).to_bytes(36, "little") for j in range(3)] for i in range(1024)]
    chunk_keys = [batches[i % 1024] for i in range(n)]
    bare = _Bare()
    allocate, free, reuse, evict = gpu.allocate, gpu.free, gpu.reuse, gpu.evict
    lookup, transfer = rec.lookup, link.transfer

    def empty() -> None:
        for _ in range(n):
            pass

    def bare_increment() -> None:
        for _ in range(n):
            bare.count += 1

    def tier_allocate() -> None:
        for _ in range(n):
            allocate(1)

    def tier_free_cached() -> None:
        for _ in range(n):
            free(1, True)

    def tier_reuse() -> None:
        for _ in range(n):
            reuse(1)

    def tier_evict() -> None:
        for _ in range(n):
            evict(1, "capacity")

    def host_store_landed() -> None:
        for keys in chunk_keys:
            host.free(3)
            host.store(3, keys)

    def lookup_per_request() -> None:
        for _ in range(n):
            lookup(512, 256, 128)

    def link_transfer_per_batch() -> None:
        for _ in range(n):
            transfer(16, 1 << 20, 1e-4)
        link.drain_durations()

    return {
        "empty_loop": empty,
        "bare_increment": bare_increment,
        "tier.allocate": tier_allocate,
        "tier.free(cached)": tier_free_cached,
        "tier.reuse": tier_reuse,
        "tier.evict(reason)": tier_evict,
        "rec.lookup (per request)": lookup_per_request,
        "host free + keyed store (3 keys)": host_store_landed,
        "link.transfer (per batch)": link_transfer_per_batch,
    }


def measure(n: int, repeats: int) -> dict[str, float]:
    """Median ns per call of every loop, the empty loop's cost subtracted."""
    loops = _loops(n)
    samples: dict[str, list[float]] = {name: [] for name in loops}
    for _ in range(repeats):  # interleave so that noise hits every loop alike
        for name, loop in loops.items():
            start = time.perf_counter_ns()
            loop()
            samples[name].append((time.perf_counter_ns() - start) / n)
    empty = statistics.median(samples.pop("empty_loop"))
    return {name: statistics.median(values) - empty for name, values in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200_000, help="calls per timed loop")
    parser.add_argument("--repeats", type=int, default=15, help="interleaved repeats")
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args()
    results = measure(args.calls, args.repeats)
    bare = results["bare_increment"]
    rows = [
        {"event": name, "ns_per_call": round(ns, 1), "ratio_to_bare_increment": round(ns / bare, 2)}
        for name, ns in results.items()
    ]
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print(f"{'event':<34} {'ns/call':>8} {'x bare +=':>10}")
    for row in rows:
        ratio = row["ratio_to_bare_increment"]
        print(f"{row['event']:<34} {row['ns_per_call']:>8.1f} {ratio:>10.2f}")
    print("(median of interleaved repeats minus the empty loop; target <= 100 ns per block event)")


if __name__ == "__main__":
    main()
