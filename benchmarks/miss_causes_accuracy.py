"""Accuracy of the missed blocks' causes (cold / evicted) against an exact LRU simulation.

Each workload of :mod:`benchmarks.reuse_accuracy` is fed to a default reuse profile of
each capacity, lookup by lookup, asking the causes of every looked-up block (as if every
one missed): cold (first seen within the horizon, 16x the capacity), evicted (seen
farther back than the capacity) or within it. The exact answer comes from every block's
exact LRU reuse distance (``tests/lru_oracle.py``). The table prints each cause's count
from the profile and the exact one, and the relative error of cold and evicted; exact
while the profile tracks every block, estimated from the sampled blocks beyond that.

    python -m benchmarks.miss_causes_accuracy
    python -m benchmarks.miss_causes_accuracy --capacities 1000 --max-keys 2048
"""

from __future__ import annotations

import argparse
import itertools

from benchmarks.reuse_accuracy import WORKLOADS
from kvobs.reuse import BUCKET_FACTORS, DEFAULT_MAX_KEYS, ReuseProfile
from tests.lru_oracle import Event, reuse_distances_in_order


def exact_causes(events: list[Event], capacity: int) -> tuple[int, int, int]:
    """(cold, evicted, within) of every counted event, by its exact LRU distance."""
    horizon = BUCKET_FACTORS[-1] * capacity
    cold = evicted = within = 0
    for distance in reuse_distances_in_order(events):
        if distance is None or distance > horizon:
            cold += 1
        elif distance > capacity:
            evicted += 1
        else:
            within += 1
    return cold, evicted, within


def profile_causes(events: list[Event], capacity: int,
                   max_keys: int) -> tuple[tuple[int, int, int], float]:
    """(cold, evicted, within) as the profile tells them, lookup run by lookup run, and
    its tracking rate at the end."""
    profile = ReuseProfile(capacity, max_keys=max_keys)
    totals = [0, 0, 0]
    for counted, run in itertools.groupby(events, key=lambda e: e[1]):
        keys = [key for key, _ in run]
        for start in range(0, len(keys), 256):
            chunk = keys[start:start + 256]
            if not counted:
                profile.write(chunk)
                continue
            found = profile.written_then_reference([], chunk, 0, len(chunk), capacity)
            totals = [a + b for a, b in zip(totals, found[:3], strict=True)]
    return (totals[0], totals[1], totals[2]), profile.tracking_rate


def _error(got: int, want: int) -> str:
    return "exact" if got == want else f"{(got - want) / max(want, 1):+.1%}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--capacities", default="1000,10000",
                        help="comma-separated capacities in blocks")
    parser.add_argument("--max-keys", type=int, default=DEFAULT_MAX_KEYS)
    args = parser.parse_args()
    print(f"{'workload':<38} {'capacity':>8} {'tracked':>7}  {'cold':>15} {'evicted':>15} "
          f"{'within':>13}  cold err  evicted err")
    for name, make in WORKLOADS.items():
        events = make(0)
        for capacity in (int(c) for c in args.capacities.split(",")):
            want = exact_causes(events, capacity)
            got, tracking = profile_causes(events, capacity, args.max_keys)
            print(f"{name:<38} {capacity:>8} {tracking:>7.3g}  "
                  f"{got[0]:>7}/{want[0]:<7} {got[1]:>7}/{want[1]:<7} {got[2]:>6}/{want[2]:<6}"
                  f"  {_error(got[0], want[0]):>8}  {_error(got[1], want[1]):>11}")


if __name__ == "__main__":
    main()
