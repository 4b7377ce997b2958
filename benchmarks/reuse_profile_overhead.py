"""What the online reuse-distance profile costs the reference pool, measured side by side.

Two identical pools (same layout, sizes, workload seed) run the demo's chat workload on
the virtual clock, one with the profile (the default) and one without
(``Recorder(profile_reuse=False)``). Chunks of ticks alternate between them so that
machine noise hits both alike; the ratio is the median chunk time (thread CPU time) with
the profile over the median without; the time spent inside the profile, as a share of
the ticks (lookups and the answers' written blocks), is a second estimate with less
noise. ``--control`` profiles both pools: on a shared VM two pool instances of 2.2 GB
can differ by more than the profile costs (1.18-1.19x measured with both profiled), and
then only the share inside the profile is a figure. Block copies are real (kvobs.kernels
on CPU), as in ``kvobs demo``. The profile runs in its C core (``ReuseCore``).

``--per-key`` times the profile alone instead: a multi-turn chat stream (lookups and
decode-written answers, ``tests/lru_oracle.py``) replayed into fresh profiles, the default
(the exact LRU stack of the most recent blocks beside a sample that tracks every block
while they fit, as an engine's profile does for its first ~131k distinct blocks), the
sample alone (``exact_keys=0``) and plain SHARDS at the same rate (the sampled blocks
alone), rounds rotating between them: nanoseconds per key and their ratio to the default,
per capacity.

    python -m benchmarks.reuse_profile_overhead            # table
    python -m benchmarks.reuse_profile_overhead --json     # machine-readable
    python -m benchmarks.reuse_profile_overhead --per-key
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import torch

from kvobs.pool import ServingLoop, TieredKVPool
from kvobs.pool.workload import ChatWorkload, WorkloadConfig
from kvobs.presets import preset_layout
from kvobs.recorder import Recorder
from kvobs.reuse import ReuseProfile


def _loop(profile: bool, gpu_blocks: int, host_blocks: int, seed: int) -> ServingLoop:
    rec = Recorder(engine="bench", profile_reuse=profile)
    pool = TieredKVPool(preset_layout("qwen2.5-0.5b"), gpu_blocks, host_blocks, rec,
                        device="cpu")
    return ServingLoop(pool, ChatWorkload(WorkloadConfig(rate=4.0), seed=seed))


def measure(chunks: int, ticks: int, gpu_blocks: int, host_blocks: int,
            warmup_s: float, wall: bool = False, control: bool = False) -> dict[str, float]:
    """Median seconds per tick with and without the profile, and per-reference figures.

    Ticks are timed in this thread's CPU time (``wall``: wall time), so that the other
    core's jobs and descheduling do not land in one pool's chunk and not the other's.
    """
    clock = time.perf_counter if wall else time.thread_time
    loops = {"profile": _loop(True, gpu_blocks, host_blocks, 0),
             "no_profile": _loop(control, gpu_blocks, host_blocks, 0)}
    for loop in loops.values():
        loop.run(warmup_s, pace=False)  # steady state: full tiers, host hits, offloads
    profile = loops["profile"].pool.recorder.start_reuse_profile()
    assert profile is not None
    inside = [0.0]  # CPU seconds spent inside the profile (a second, low-noise estimate)
    reference, write = profile.reference, profile.write

    def timed_reference(keys: list[int]) -> None:
        start = clock()
        reference(keys)
        inside[0] += clock() - start

    def timed_write(keys: list[int]) -> None:  # the answers' blocks written at release
        start = clock()
        write(keys)
        inside[0] += clock() - start

    profile.reference = timed_reference  # type: ignore[method-assign,assignment]
    profile.write = timed_write  # type: ignore[method-assign,assignment]
    times: dict[str, list[float]] = {name: [] for name in loops}
    for chunk in range(chunks):
        order = list(loops.items()) if chunk % 2 == 0 else list(reversed(loops.items()))
        for name, loop in order:
            start = clock()
            for _ in range(ticks):
                loop.step()
            times[name].append((clock() - start) / ticks)
    with_profile = statistics.median(times["profile"])
    without = statistics.median(times["no_profile"])
    return {
        "tick_s_with_profile": with_profile,
        "tick_s_without": without,
        "ratio": with_profile / without,
        "share_inside_profile": inside[0] / sum(times["profile"]) / ticks,
        "references": profile.total,
        "sampled_references": profile.sampled,
        "sample_rate": profile.rate,
    }


#: The profiles ``--per-key`` sets side by side: the default (the exact LRU stack of the
#: 131,072 most recent blocks beside the sample), the sample alone (the profile before the
#: exact stack), and plain SHARDS at the rate (the sampled blocks alone).
VARIANTS: dict[str, dict[str, Any]] = {
    "default": {},
    "sample alone": {"exact_keys": 0},
    "plain SHARDS": {"exact_keys": 0, "adaptive": False},
}


def per_key(capacities: list[int], rounds: int, requests: int) -> list[dict[str, Any]]:
    """Median nanoseconds per key of each of :data:`VARIANTS` at each capacity."""
    from tests.lru_oracle import chat_with_answers  # the accuracy traces' generator

    stream = [(keys, counted) for prompt, answer in chat_with_answers(requests, seed=1)
              for keys, counted in ((prompt, True), (answer, False))]
    keys = sum(len(k) for k, _ in stream)
    rows = []
    for capacity in capacities:
        times: dict[str, list[float]] = {name: [] for name in VARIANTS}
        shares = {}
        for r in range(rounds):
            order = list(VARIANTS)[r % len(VARIANTS):] + list(VARIANTS)[:r % len(VARIANTS)]
            for name in order:
                profile = ReuseProfile(capacity, **VARIANTS[name])
                record = profile.record
                start = time.thread_time_ns()
                for batch, counted in stream:
                    record(batch, counted)
                times[name].append((time.thread_time_ns() - start) / keys)
                shares[name] = profile.tracking_rate
        medians = {name: statistics.median(t) for name, t in times.items()}
        rows.append({"capacity": capacity, "rate": ReuseProfile(capacity).rate, "keys": keys,
                     "ns_per_key": medians, "tracking_rate": shares,
                     "exact_keys": ReuseProfile(capacity).exact_keys})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, default=40, help="alternating chunks per pool")
    parser.add_argument("--ticks", type=int, default=20, help="ticks (0.05 virtual s) per chunk")
    parser.add_argument("--gpu-blocks", type=int, default=2048)
    parser.add_argument("--host-blocks", type=int, default=8192)
    parser.add_argument("--warmup", type=float, default=60.0, help="virtual seconds first")
    parser.add_argument("--wall", action="store_true", help="time in wall time, not CPU time")
    parser.add_argument("--control", action="store_true",
                        help="profile both pools: the ratio is then the bias between the two "
                        "pool instances alone (noise gauge)")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument("--per-key", action="store_true",
                        help="time the profile alone: default vs plain SHARDS, per key")
    parser.add_argument("--capacities", default="10000,100000",
                        help="with --per-key: capacities in blocks, comma-separated")
    parser.add_argument("--rounds", type=int, default=7, help="with --per-key: rounds")
    parser.add_argument("--requests", type=int, default=40_000,
                        help="with --per-key: chat requests in the stream")
    args = parser.parse_args()
    if args.per_key:
        rows = per_key([int(c) for c in args.capacities.split(",")], args.rounds,
                       args.requests)
        if args.json:
            print(json.dumps(rows, indent=2))
            return
        for row in rows:
            ns = row["ns_per_key"]
            print(f"capacity {row['capacity']:,} blocks (rate {row['rate']:g}, exact stack "
                  f"{row['exact_keys']:,} blocks), {row['keys']:,} keys: " + ", ".join(
                      f"{name} {ns[name]:.0f} ns/key ({ns[name] / ns['default']:.2f}x; "
                      f"share {row['tracking_rate'][name]:g} at the end)" for name in ns))
        return
    torch.set_num_threads(1)
    result = measure(args.chunks, args.ticks, args.gpu_blocks, args.host_blocks, args.warmup,
                     args.wall, args.control)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    with_ms, without_ms = result["tick_s_with_profile"] * 1e3, result["tick_s_without"] * 1e3
    print(f"reference pool tick with the reuse profile: {with_ms:.3f} ms")
    print(f"                        without it:         {without_ms:.3f} ms")
    print(f"ratio {result['ratio']:.3f}x (goal <= 1.02x); time inside the profile "
          f"{result['share_inside_profile']:.2%} of the ticks; {result['references']:,} "
          f"references, {result['sampled_references']:,} sampled at rate "
          f"{result['sample_rate']:g}")


if __name__ == "__main__":
    main()
