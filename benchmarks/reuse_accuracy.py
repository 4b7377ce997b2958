"""Accuracy of the online reuse profile (default settings) against an exact LRU simulation.

For each workload (Zipf popularity, a cyclic loop, a one-pass scan mixed with a hot
set, prefix-structured chat) and several seeds, every bucket bound of the default
profile is compared with an exact LRU cache of that many blocks; the table prints the
largest absolute error of the predicted hit ratio per workload (goal <= 0.02).

    python benchmarks/reuse_accuracy.py            # table
    python benchmarks/reuse_accuracy.py --json
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the test oracle
from lru_oracle import (
    chat_prefixes,
    exact_lru_hit_ratio,
    loop,
    scan_with_hot_set,
    zipf,
)

from kvobs.reuse import ReuseProfile

WORKLOADS = {
    "zipf-0.9 (20k keys)": lambda seed: zipf(150_000, 20_000, 0.9, seed=seed),
    "zipf-1.2 (50k keys)": lambda seed: zipf(150_000, 50_000, 1.2, seed=seed),
    "loop of 5000": lambda seed: loop(120_000, 5000),
    "scan + hot set": lambda seed: scan_with_hot_set(120_000, 1500, seed=seed),
    "chat prefixes": lambda seed: list(itertools.chain.from_iterable(chat_prefixes(6000, seed))),
}


def worst_error(references: list, capacity: int) -> tuple[float, int]:
    """Largest |profile - exact| over the default profile's bucket bounds, and the rate's
    sampled reference count."""
    profile = ReuseProfile(capacity)
    for start in range(0, len(references), 64):
        profile.reference(references[start:start + 64])
    error = max(abs(profile.hit_ratio(size) - exact_lru_hit_ratio(references, size))
                for size in profile.bounds)
    return error, profile.sampled


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--capacity", type=int, default=2000, help="configured blocks")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = []
    for name, make in WORKLOADS.items():
        errors = [worst_error(make(seed), args.capacity)[0] for seed in range(1, args.seeds + 1)]
        rows.append({"workload": name, "max_abs_error": round(max(errors), 4),
                     "per_seed": [round(e, 4) for e in errors]})
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print(f"{'workload':<22} {'max |error|':>11}  per seed")
    for row in rows:
        print(f"{row['workload']:<22} {row['max_abs_error']:>11.4f}  {row['per_seed']}")


if __name__ == "__main__":
    main()
