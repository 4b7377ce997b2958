"""A CPU engine's steps as the vLLM adapter feeds them to the prefill-cost fit.

Issue 46: on ``vllm serve`` on a CPU the measured cost took 600 s. The adapter
(:mod:`kvobs.adapters.vllm.steps`) times one step in 4 for its first 256 timed steps, then
one in 32; where one engine step in 10 or 20 prefills, the 32 timed prefill steps the fit
waited for came long after the stride had widened. This model gives engine steps of
``a + b x prefill + c x decode`` seconds plus noise, a new prompt's prefill (after its
host hits; lognormal, up to 2,048 tokens) in a share of the steps, a decode batch that
drifts between 1 and 48, and reports after how many engine steps the fit first uses a
measured cost, and how far that cost is from ``b``.

``python -m tests.core.prefill_fit_sim`` prints the table behind the figures in
:mod:`kvobs.benefit`'s docstring (the gate before against the one now: ``--before``
monkeypatches the old thresholds and error back in).
"""

from __future__ import annotations

import random
import statistics
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from unittest import mock

import kvobs.benefit as benefit
from kvobs.benefit import PrefillCost

#: The CPU engine's seconds per prefill token (issue 46's 0.483 ms).
COST = 4.83e-4
#: Engine steps of one run (about 10 min at the CPU engine's ~25 steps/s).
STEPS = 16_000

Step = tuple[float, int, int]
Noise = Callable[[random.Random, float, int], float]


def gauss(share: float) -> Noise:
    """Noise of ``share`` of the step's time (one standard deviation)."""
    return lambda rng, t, prefill: rng.gauss(0.0, share * t)


def noisier_prefill(share: float, factor: float = 4.0) -> Noise:
    """As :func:`gauss`, ``factor`` times more on steps with prefill (a loaded CPU)."""
    return lambda rng, t, prefill: rng.gauss(0.0, share * t * (factor if prefill else 1))


def stalls(share: float, chance: float, mean_s: float) -> Noise:
    """As :func:`gauss`, plus a stall of ``mean_s`` on average in ``chance`` of the steps."""
    def noise(rng: random.Random, t: float, prefill: int) -> float:
        stall = rng.expovariate(1 / mean_s) if rng.random() < chance else 0.0
        return rng.gauss(0.0, share * t) + stall
    return noise


NOISES: dict[str, Noise] = {
    "gauss 5%": gauss(0.05), "gauss 15%": gauss(0.15),
    "prefill 4x noisier, 10%": noisier_prefill(0.10),
    "prefill 4x noisier, 25%": noisier_prefill(0.25),
    "stalls": stalls(0.05, 0.05, 0.5),
}


def engine_steps(rng: random.Random, prefill_share: float, noise: Noise,
                 cost: float = COST) -> Iterator[Step]:
    """Endless ``(seconds, prefill, decode)`` engine steps."""
    decode = 8
    while True:
        decode = max(1, min(48, decode + rng.choice((-1, 0, 1))))
        prefill = 0
        if rng.random() < prefill_share:
            prefill = min(int(rng.lognormvariate(6.3, 0.8)), 2048)
        t = 0.02 + cost * prefill + 0.004 * decode
        yield max(t + noise(rng, t, prefill), 1e-4), prefill, decode


def fed(steps: Iterator[Step], limit: int = STEPS, every: int = 4, warm: int = 256,
        steady_every: int = 32) -> list[tuple[int, Step]]:
    """The steps the vLLM adapter times, with their engine step numbers."""
    timed: list[tuple[int, Step]] = []
    for number in range(limit):
        step = next(steps)
        if number % every == 0:
            timed.append((number, step))
            if len(timed) == warm:
                every = steady_every
    return timed


def first_cost(timed: list[tuple[int, Step]], cost: float = COST) -> tuple[int, float] | None:
    """``(engine step, relative error)`` of the first measured cost, None if none came."""
    fit = PrefillCost()
    for number, step in timed:
        fit.observe_step(*step)
        if fit.source == "measured":
            return number, fit.seconds_per_token / cost - 1
    return None


def _homoscedastic(steps: tuple[list[list[float]], list[float], float],
                   prefill: tuple[list[list[float]], list[float], float],
                   fit: list[float] | None) -> float:
    """The relative error before issue 46: all steps' residual variance alone, no t."""
    xtx, xty, yty = steps
    if fit is None or fit[1] <= 0 or xtx[0][0] <= 3:
        return float("inf")
    column = benefit._solve3(xtx, [0.0, 1.0, 0.0])
    if column is None or column[1] <= 0:
        return float("inf")
    residual = max(yty - sum(b * v for b, v in zip(fit, xty, strict=True)), 0.0)
    return float((residual / (xtx[0][0] - 3) * column[1]) ** 0.5 / fit[1])


@contextmanager
def gate_before() -> Iterator[None]:
    """The fit's gate before issue 46: 32 prefill steps, one passing solve, the error of
    all steps' residual variance alone."""
    with mock.patch.object(benefit, "_MIN_STEPS", 32), \
            mock.patch.object(benefit, "_PASSES", 1), \
            mock.patch.object(benefit, "_relative_error", _homoscedastic):
        yield


def table(runs: int = 80, shares: tuple[float, ...] = (0.05, 0.1, 0.3)) -> None:
    """Print, per case, the median engine steps to a cost and the accepted fits off by
    more than 20%, for the gate now and the one before."""
    totals: dict[str, list[float]] = {"now": [0, 0], "before": [0, 0]}
    medians: dict[str, list[float]] = {"now": [], "before": []}
    for share in shares:
        for name, noise in NOISES.items():
            streams = [fed(engine_steps(random.Random(seed), share, noise))
                       for seed in range(runs)]
            for gate in ("before", "now"):
                with gate_before() if gate == "before" else mock.patch.object(
                        benefit, "_MIN_STEPS", benefit._MIN_STEPS):
                    got = [first_cost(timed) for timed in streams]
                found = [g for g in got if g is not None]
                median = statistics.median([g[0] for g in found]) if found else STEPS
                bad = sum(abs(g[1]) > 0.2 for g in found)
                totals[gate][0] += bad
                totals[gate][1] += len(found)
                medians[gate].append(median)
                print(f"prefill in {share:4.0%} of steps, {name:24s} {gate:6s}: median "
                      f"{median:7,.0f} engine steps, none in {runs - len(found):2d} runs, "
                      f"{bad:2d} of {len(found):2d} off by > 20%", flush=True)
    for gate, (bad, accepted) in totals.items():
        print(f"{gate}: median of the medians {statistics.median(medians[gate]):,.0f} "
              f"engine steps; {bad:.0f} of {accepted:.0f} accepted fits off by > 20%")


if __name__ == "__main__":
    table(int(sys.argv[1]) if len(sys.argv) > 1 else 80)
