"""Accuracy of the online reuse profile (default settings) against an exact LRU simulation.

Every workload is a trace of cache events: prefix lookups (counted) and, for multi-turn
chat, the answer blocks an engine writes during decode (not counted, but cached: the next
turn's prompt hits them). For each configured capacity from 1,000 to 100,000 blocks and
each hash salt (which blocks get sampled), the default profile's predicted hit ratio at
every bucket bound is compared with the exact LRU answer of the same events (every
reuse distance, in one pass: ``tests/lru_oracle.py``); the table prints the largest and
the mean absolute error per workload and capacity, over bounds and salts (goal: max <=
0.02, mean <= 0.01), with the
sampling rate (the counted share of blocks) and the tracking rate at the end of the trace
(the share whose recency was kept: 1 while the blocks in use fit in ``max_keys``, when the
sampled blocks' distances are exact; the lowest over salts). These traces hold fewer
distinct blocks than the default bound (131,072), so a fresh profile tracks them all;
``--aged`` feeds it first, as a long-running engine would have, twice ``max_keys / rate``
distinct blocks written once and never seen again (older than every reference of the
trace: the exact answer is unchanged), so the tracked share is down to the sampling rate
when the trace starts: the accuracy of the default settings in production. ``--max-keys``
shrinks the memory bound (lower rates, sampled within the trace); ``--fixed`` tracks the
sampled blocks alone (the profile before the adaptive tracking), for comparison;
``--exact-keys 0`` drops the exact LRU stack kept beside the sample (the profile before
it), ``--exact-keys N`` keeps N blocks there. ``--long`` adds traces whose distances
reach far past 131,072 blocks (a Zipf over 2 million blocks, chat with 6,000
conversations coming back): there the default profile's largest buckets come from its
sampled stack.

    python -m benchmarks.reuse_accuracy                    # table
    python -m benchmarks.reuse_accuracy --json
    python -m benchmarks.reuse_accuracy --capacities 1000,100000 --salts 5
    python -m benchmarks.reuse_accuracy --aged             # a profile that has aged
    python -m benchmarks.reuse_accuracy --max-keys 4096    # sampled distances
    python -m benchmarks.reuse_accuracy --aged --exact-keys 0   # the sample alone
    python -m benchmarks.reuse_accuracy --aged --long --only long   # distances past 131,072
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from bisect import bisect_right
from collections.abc import Callable
from typing import Any

from kvobs.reuse import DEFAULT_MAX_KEYS, ReuseProfile, default_rate
from tests.lru_oracle import (  # the tests' exact-LRU oracle
    Event,
    chat_prefixes,
    chat_with_answers,
    exact_reuse_distances,
    loop,
    loop_with_hot_set,
    mixed_trace,
    scan_with_hot_set,
    zipf,
)

_MASK = (1 << 64) - 1
#: A trace's exact answer: its sorted reuse distances (cold references left out) and its
#: counted references (tests/lru_oracle.py exact_reuse_distances).
Exact = tuple[list[int], int]
#: Keys of the aged profile's earlier blocks: apart from every workload's keys.
_AGED_BASE = 1 << 62
ADVERSARIAL = "adversarial: "


def _lookups(keys: list[int]) -> list[Event]:
    return [(key, True) for key in keys]


def _chat(requests: int, seed: int, hot: int = 0, live: int = 600) -> list[Event]:
    events: list[Event] = []
    for prompt, answer in chat_with_answers(requests, seed, hot_system_blocks=hot,
                                            live_conversations=live):
        events.extend((key, True) for key in prompt)
        events.extend((key, False) for key in answer)
    return events


WORKLOADS: dict[str, Callable[[int], list[Event]]] = {
    "zipf-0.9 (20k keys)": lambda seed: _lookups(zipf(150_000, 20_000, 0.9, seed=seed)),
    "zipf-1.2 (50k keys)": lambda seed: _lookups(zipf(150_000, 50_000, 1.2, seed=seed)),
    "loop of 5000": lambda seed: _lookups(loop(120_000, 5000)),
    "scan + hot set of 1500": lambda seed: _lookups(scan_with_hot_set(120_000, 1500, seed=seed)),
    "scan + hot set of 40": lambda seed: _lookups(scan_with_hot_set(120_000, 40, seed=seed)),
    "chat prefixes": lambda seed: _lookups(
        list(itertools.chain.from_iterable(chat_prefixes(6000, seed)))),
    "chat + decode answers": lambda seed: _chat(9000, seed),
    "chat, tiny hot system": lambda seed: _chat(9000, seed, hot=3),
    "mixed (unseen), 320k": lambda seed: mixed_trace(320_000, seed),
    # Adversarial: 4,960 + 40 = 5,000 distinct blocks between a loop block's uses, so every
    # reuse sits exactly on the 5,000-block bound of a 10,000-block capacity; a sampled
    # distance lands on either side of it (the pure loop above is exact there: no more
    # distinct blocks than references since, and a pure loop has no repeats).
    ADVERSARIAL + "loop 4960 + hot 40": lambda seed: _lookups(
        loop_with_hot_set(120_000, 4960, 40, seed=seed)),
}

#: ``--long``: traces whose reuse distances reach far past the default bound (131,072
#: blocks), where the default profile's buckets come from its sampled stack.
LONG_WORKLOADS: dict[str, Callable[[int], list[Event]]] = {
    "long: zipf-0.8 (2M keys, 3M refs)": lambda seed: _lookups(
        zipf(3_000_000, 2_000_000, 0.8, seed=seed)),
    "long: chat, 6,000 live conversations": lambda seed: _chat(60_000, seed, live=6000),
}


def salted(events: list[Event], salt: int) -> list[Event]:
    """The same trace under another hash salt: keys XORed with a per-salt constant (a
    bijection: the LRU answer is unchanged, the sampled blocks are not)."""
    if not salt:
        return events
    mix = (salt * 0x9E3779B97F4A7C15) & _MASK
    return [(key ^ mix, counted) for key, counted in events]  # type: ignore[operator]


def aged_blocks(capacity: int, max_keys: int = DEFAULT_MAX_KEYS) -> int:
    """Distinct blocks that bring a fresh profile's tracked share down to its sampling
    rate and fill its bound there: twice ``max_keys / rate``."""
    return int(2 * max_keys / default_rate(capacity, max_keys))


def profile_of(events: list[Event], capacity: int, max_keys: int = DEFAULT_MAX_KEYS,
               adaptive: bool = True, aged: int = 0, salt: int = 0,
               exact_keys: int | None = None) -> ReuseProfile:
    """The default profile fed request by request (runs of lookups, runs of writes),
    after ``aged`` distinct blocks written once (under the trace's ``salt``)."""
    profile = ReuseProfile(capacity, max_keys=max_keys, adaptive=adaptive,
                           exact_keys=exact_keys)
    mix = (salt * 0x9E3779B97F4A7C15) & _MASK if salt else 0
    for start in range(0, aged, 4096):
        profile.write([(_AGED_BASE + i) ^ mix for i in range(start, min(start + 4096, aged))])
    for counted, run in itertools.groupby(events, key=lambda e: e[1]):
        keys = [key for key, _ in run]
        for start in range(0, len(keys), 256):
            (profile.reference if counted else profile.write)(keys[start:start + 256])
    return profile


def errors(events: list[Event], capacity: int, salts: int, exact: Exact,
           max_keys: int = DEFAULT_MAX_KEYS, adaptive: bool = True,
           aged: bool = False, exact_keys: int | None = None) -> tuple[list[float], float]:
    """|profile - exact| at every bucket bound, for every salt; the lowest tracking rate
    at the end. ``exact``: the trace's sorted exact reuse distances and counted events."""
    out, tracking = [], 1.0
    earlier = aged_blocks(capacity, max_keys) if aged else 0
    distances, counted = exact
    for salt in range(salts):
        profile = profile_of(salted(events, salt), capacity, max_keys, adaptive,
                             aged=earlier, salt=salt, exact_keys=exact_keys)
        tracking = min(tracking, profile.tracking_rate)
        for bound in profile.bounds:
            truth = bisect_right(distances, bound) / counted
            out.append(abs(profile.hit_ratio(bound) - truth))
    return out, tracking


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--capacities", default="1000,3000,10000,30000,100000",
                        help="configured capacities in blocks, comma-separated")
    parser.add_argument("--salts", type=int, default=3, help="hash salts per capacity")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--only", default="", help="run workloads whose name contains this")
    parser.add_argument("--max-keys", type=int, default=DEFAULT_MAX_KEYS,
                        help="the profile's memory bound in tracked blocks")
    parser.add_argument("--fixed", action="store_true",
                        help="track the sampled blocks alone (no adaptive tracking)")
    parser.add_argument("--aged", action="store_true",
                        help="a profile that has seen 2 x max_keys / rate distinct blocks "
                             "before the trace (a long-running engine's)")
    parser.add_argument("--exact-keys", type=int, default=None,
                        help="the exact LRU stack beside the sample, in blocks (default: "
                             "max_keys where the rate is below 1; 0: the sample alone)")
    parser.add_argument("--long", action="store_true",
                        help="also traces whose reuse distances reach past 131,072 blocks "
                             "(3M references; minutes)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    capacities = [int(c) for c in args.capacities.split(",")]
    rows: list[dict[str, Any]] = []
    workloads = {**WORKLOADS, **(LONG_WORKLOADS if args.long else {})}
    for name, make in workloads.items():
        if args.only not in name:
            continue
        started = time.monotonic()
        events = make(args.seed)
        exact = exact_reuse_distances(events)
        for capacity in capacities:
            errs, tracking = errors(events, capacity, args.salts, exact,
                                    max_keys=args.max_keys, adaptive=not args.fixed,
                                    aged=args.aged, exact_keys=args.exact_keys)
            rows.append({"workload": name, "capacity": capacity,
                         "references": sum(1 for _, c in events if c),
                         "rate": ReuseProfile(capacity, max_keys=args.max_keys).rate,
                         "tracking_rate": tracking,
                         "max_abs_error": round(max(errs), 4),
                         "mean_abs_error": round(sum(errs) / len(errs), 4)})
        if not args.json:
            print(f"# {name}: {time.monotonic() - started:.0f} s", file=sys.stderr)
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print(f"{'workload':<34} {'capacity':>8} {'rate':>7} {'tracked':>7} {'max |err|':>9} "
          f"{'mean |err|':>10}")
    for row in rows:
        print(f"{row['workload']:<34} {row['capacity']:>8,} {row['rate']:>7.4f} "
              f"{row['tracking_rate']:>7.4f} {row['max_abs_error']:>9.4f} "
              f"{row['mean_abs_error']:>10.4f}")
    plain = [r for r in rows if not r["workload"].startswith(ADVERSARIAL)]
    for label, chosen in (("worst", rows), ("worst but adversarial", plain)):
        if not chosen or (chosen is plain and len(plain) == len(rows)):
            continue
        worst = max(chosen, key=lambda r: r["max_abs_error"])
        print(f"{label}: max {worst['max_abs_error']:.4f} ({worst['workload']}, "
              f"{worst['capacity']:,} blocks); worst mean "
              f"{max(r['mean_abs_error'] for r in chosen):.4f}; goal max <= 0.02, "
              f"mean <= 0.01")


if __name__ == "__main__":
    main()
