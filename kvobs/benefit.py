"""Does the host pool pay for itself? The prefill time its hits save, against its onloads.

A host (or disk) hit saves the prefill compute of its tokens and costs an onload. kvobs
counts the saving as ``hit tokens x prefill seconds per token`` at each lookup, preempted
requests' re-lookups included (``kvobs_prefill_saved_seconds_total{tier}``), and the cost
as the onload transfers' device seconds, each transfer once
(``kvobs_transfer_seconds_total{src_tier="host",dst_tier="gpu"}``); the
``instance:kvobs_host_pool_net_benefit_seconds:rate5m`` rule subtracts one from the other
per process, and has no answer where either side is unknown (no cost, no onload series,
or onloads without seconds): unknown is never counted as free.

The prefill cost per token comes from one of three sources, exported as
``kvobs_prefill_cost_info{source}``:

* ``measured``: where the engine lets kvobs see its step times and the tokens each step
  scheduled, :meth:`PrefillCost.observe_step` fits ``step = a + b x prefill + c x
  decode`` by least squares with forgetting (old steps fade with a half-life of about
  700 steps; the normal equations are solved every 16th step); ``b`` is the cost, used
  once 32 steps with prefill were seen *and* its relative standard error (exported as
  ``kvobs_prefill_cost_relative_error``) is at most 10%, i.e. the 95% interval is within
  about +-20%. A poorer fit (a loaded machine, steps too alike to tell prefill from the
  rest) falls back to the configured cost, or to none: never a silently wild figure;
* ``modelled``: a simulation that knows its own cost (``kvobs demo``);
* ``configured``: a figure the operator passes (``KVOBS_PREFILL_SECONDS_PER_TOKEN``, read
  with the other telemetry settings, :mod:`kvobs.telemetry.settings`, and set here by
  :meth:`kvobs.exporter.Telemetry.start`; this module reads no environment).

Until one is known (``source="none"``) nothing is counted as saved: a guess would be a
figure that disagrees with the engine.

Example:
    >>> cost = PrefillCost()
    >>> for step in range(200):                  # 20 us per prefill token, 5 ms per step
    ...     prefill, decode = (step * 37) % 512, 64
    ...     cost.observe_step(0.005 + 20e-6 * prefill + 1e-5 * decode, prefill, decode)
    >>> cost.source, round(cost.seconds_per_token * 1e6, 3)
    ('measured', 20.0)
"""

from __future__ import annotations

import threading

from kvobs.errors import ConfigError

SOURCES: tuple[str, ...] = ("none", "configured", "modelled", "measured")
_FORGET = 0.999
_MIN_STEPS = 32
#: The largest relative standard error of the fitted cost that is used (+-20% at 95%).
MAX_RELATIVE_ERROR = 0.10
_SOLVE_EVERY = 16  # observations between two solves of the normal equations


class PrefillCost:
    """Seconds of prefill compute per prompt token, and where the figure comes from.

    Starts unknown; :meth:`set` gives it a configured or modelled figure (telemetry's
    start sets ``KVOBS_PREFILL_SECONDS_PER_TOKEN``'s), :meth:`observe_step` measures one.
    """

    def __init__(self) -> None:
        self.seconds_per_token = 0.0
        self.source = "none"
        #: Relative standard error of the last fit (inf until a fit was made).
        self.relative_error = float("inf")
        self._fallback = (0.0, "none")  # what a poor fit falls back to
        self._lock = threading.Lock()
        # Normal equations of the fit over x = (1, prefill, decode), with forgetting.
        self._xtx = [[0.0] * 3 for _ in range(3)]
        self._xty = [0.0] * 3
        self._yty = 0.0
        self._prefill_steps = 0
        self._steps = 0

    def set(self, seconds_per_token: float, source: str = "configured") -> None:
        """Use a known cost (``configured`` or ``modelled``); a measured one replaces it."""
        if source not in ("configured", "modelled"):
            raise ConfigError(f"prefill cost source must be configured or modelled, got "
                              f"{source!r}")
        if not seconds_per_token >= 0 or seconds_per_token == float("inf"):
            raise ConfigError(f"prefill seconds per token must be a finite number >= 0, got "
                              f"{seconds_per_token!r}: pass e.g. 2.5e-5")
        self.seconds_per_token, self.source = float(seconds_per_token), source
        self._fallback = (self.seconds_per_token, source)

    def observe_step(self, seconds: float, prefill_tokens: int, decode_tokens: int) -> None:
        """One engine step took ``seconds`` for ``prefill_tokens`` + ``decode_tokens``.

        The normal equations are updated in place, unrolled (the matrix is symmetric:
        six sums, not nine): about a microsecond; the solve runs every
        :data:`_SOLVE_EVERY`-th observation.
        """
        p, d, y = float(prefill_tokens), float(decode_tokens), seconds
        f = _FORGET
        with self._lock:
            xtx, xty = self._xtx, self._xty
            row0, row1, row2 = xtx
            row0[0] = f * row0[0] + 1.0
            row0[1] = row1[0] = f * row0[1] + p
            row0[2] = row2[0] = f * row0[2] + d
            row1[1] = f * row1[1] + p * p
            row1[2] = row2[1] = f * row1[2] + p * d
            row2[2] = f * row2[2] + d * d
            xty[0] = f * xty[0] + y
            xty[1] = f * xty[1] + p * y
            xty[2] = f * xty[2] + d * y
            self._yty = f * self._yty + y * y
            self._steps += 1
            if prefill_tokens:
                self._prefill_steps += 1
            if self._prefill_steps >= _MIN_STEPS and self._steps % _SOLVE_EVERY == 0:
                self._refit()

    def _refit(self) -> None:
        """Solve the fit; use its cost while its relative standard error is small."""
        fit = _solve3(self._xtx, self._xty)
        error = _relative_error(self._xtx, self._xty, self._yty, fit)
        self.relative_error = error
        if fit is not None and error <= MAX_RELATIVE_ERROR:
            self.seconds_per_token, self.source = fit[1], "measured"
        elif self.source == "measured":
            self.seconds_per_token, self.source = self._fallback


def _relative_error(xtx: list[list[float]], xty: list[float], yty: float,
                    fit: list[float] | None) -> float:
    """Standard error of the prefill coefficient over its value (inf: no usable fit):
    residual variance ``(y'y - b'X'y) / (n - 3)`` times ``(X'X)^-1`` at the prefill term,
    ``n`` the (forgetting-weighted) number of steps."""
    if fit is None or fit[1] <= 0:
        return float("inf")
    n = xtx[0][0]
    column = _solve3(xtx, [0.0, 1.0, 0.0])
    if n <= 3 or column is None or column[1] <= 0:
        return float("inf")
    residual = max(yty - sum(b * v for b, v in zip(fit, xty, strict=True)), 0.0) / (n - 3)
    return float((residual * column[1]) ** 0.5 / fit[1])


def _solve3(a: list[list[float]], b: list[float]) -> list[float] | None:
    """Solve ``a x = b`` for the 3x3 normal equations, with a little ridge so that a
    constant decode batch (collinear with the intercept) still leaves the prefill
    coefficient identifiable; None if singular."""
    ridge = 1e-9 * (a[0][0] + a[1][1] + a[2][2])
    m = [[*(v + ridge * (i == j) for j, v in enumerate(row)), rhs]
         for i, (row, rhs) in enumerate(zip(a, b, strict=True))]
    for col in range(3):
        pivot = max(range(col, 3), key=lambda r: abs(m[r][col]))
        if abs(m[pivot][col]) < 1e-12 * max(1.0, abs(m[col][col])):
            return None
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(3):
            if r != col:
                factor = m[r][col] / m[col][col]
                m[r] = [v - factor * p for v, p in zip(m[r], m[col], strict=True)]
    return [m[i][3] / m[i][i] for i in range(3)]
