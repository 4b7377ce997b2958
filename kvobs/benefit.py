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
``kvobs_prefill_cost_info{source}`` (and ``kvobs_prefill_cost_seconds`` while one is
known):

* ``measured``: where the engine lets kvobs see its step times and the tokens each step
  scheduled, :meth:`PrefillCost.observe_step` fits ``step = a + b x prefill + c x
  decode`` by least squares with forgetting (old steps fade with a half-life of about
  700 steps; the normal equations are solved every 16th step, once 8 steps with prefill
  were seen); ``b`` is the cost, used while its relative error (exported as
  ``kvobs_prefill_cost_relative_error``) is at most 10%, i.e. the 95% interval is within
  about +-20%, and a first measured cost only once two solves in a row passed. A poorer
  fit (a loaded machine, steps too alike to tell prefill from the rest) falls back to the
  configured cost, or to none: never a silently wild figure;
* ``modelled``: a simulation that knows its own cost (``kvobs demo``);
* ``configured``: a figure the operator passes (``KVOBS_PREFILL_SECONDS_PER_TOKEN``, read
  with the other telemetry settings, :mod:`kvobs.telemetry.settings`, and set here by
  :meth:`kvobs.exporter.Telemetry.start`; this module reads no environment).

**Tokens before the first cost are credited at the first cost.** While none is known
(``source="none"``) a lookup's host and disk hit tokens are held (:meth:`PrefillCost.hold`),
not guessed at; the first cost known after them (configured or measured) credits them all
at once (:attr:`PrefillCost.backlog_host_s`, added to the recorder's saving), so
``kvobs_prefill_saved_seconds_total{tier}`` is every hit token x the cost known when it
was credited: until a measured cost changes, all host-hit tokens x that cost. The counter
steps up by the backlog when the cost arrives (a burst in ``rate()`` over that window);
until then it stays at 0 and the dashboards draw the saving as unknown.

Why these thresholds: the vLLM adapter times one step in 4 for its first 256 timed steps,
then one in 32 (:mod:`kvobs.adapters.vllm.steps`). On a CPU engine where one step in 10 or
20 prefills, the 32 timed prefill steps the fit waited for came after the stride had
widened: in a model of that engine (``tests/core/prefill_fit_sim.py``, 80 runs a case) a
cost came after a median 3,552 engine steps at one prefill step in 10, 12,256 at one in
20 (a quarter of the runs had none in 16,000). Eight prefill steps are enough for the
fit itself; what made few of them risky is an error estimate that trusts them too much,
so the relative error now takes the larger of the residual variances over all steps and
over the steps with prefill alone (a bound on the coefficient's variance where the
prefill steps are the noisier ones: a loaded CPU, a stall during a long prefill), scales
it by Student's t for the prefill steps' degrees of freedom, and a first measured cost
needs two passing solves in a row. The same model now reaches a cost after a median 380
engine steps at one prefill step in 10 and 700 at one in 20 (the median over all its 15
cases of noise and prefill share: 700, 3,552 before) and accepts fewer fits off by more
than 20% (53 of 992 accepted, 147 of 1,095 before); fits whose prefill steps are too
noisy or too few are still refused (``tests/core/test_benefit_fit.py``).

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
#: Steps with prefill before the fit is solved (the error's t factor and the two passing
#: solves guard what so few steps could not).
_MIN_STEPS = 8
#: The largest relative error of the fitted cost that is used (+-20% at 95%).
MAX_RELATIVE_ERROR = 0.10
_SOLVE_EVERY = 16  # observations between two solves of the normal equations
#: Solves in a row within MAX_RELATIVE_ERROR before a first measured cost is used.
_PASSES = 2
_Z95 = 1.959964  # the normal distribution's 97.5% quantile


class PrefillCost:
    """Seconds of prefill compute per prompt token, and where the figure comes from.

    Starts unknown; :meth:`set` gives it a configured or modelled figure (telemetry's
    start sets ``KVOBS_PREFILL_SECONDS_PER_TOKEN``'s), :meth:`observe_step` measures one.
    Hit tokens that met no cost (:meth:`hold`) are credited at the next cost known after
    them, the first one for those of the first minutes: :attr:`backlog_host_s` and
    :attr:`backlog_disk_s`.
    """

    def __init__(self) -> None:
        self.seconds_per_token = 0.0
        self.source = "none"
        #: Relative error of the last fit (inf until a fit was made).
        self.relative_error = float("inf")
        #: Hit tokens held while no cost was known (host, disk), not yet credited.
        self.held_host_tokens = 0
        self.held_disk_tokens = 0
        #: Seconds credited for held tokens when a cost became known (host, disk).
        self.backlog_host_s = 0.0
        self.backlog_disk_s = 0.0
        self._fallback = (0.0, "none")  # what a poor fit falls back to
        self._lock = threading.Lock()
        # Normal equations of the fit over x = (1, prefill, decode), with forgetting.
        self._xtx = [[0.0] * 3 for _ in range(3)]
        self._xty = [0.0] * 3
        self._yty = 0.0
        # The same over the steps with prefill alone, faded when one is added (its
        # forgetting caught up over the steps since the last one, _prefill_at).
        self._pxtx = [[0.0] * 3 for _ in range(3)]
        self._pxty = [0.0] * 3
        self._pyty = 0.0
        self._prefill_at = 0
        self._prefill_steps = 0
        self._steps = 0
        self._passes = 0  # solves in a row within MAX_RELATIVE_ERROR

    def set(self, seconds_per_token: float, source: str = "configured") -> None:
        """Use a known cost (``configured`` or ``modelled``); a measured one replaces it.
        Hit tokens held until now are credited at it."""
        if source not in ("configured", "modelled"):
            raise ConfigError(f"prefill cost source must be configured or modelled, got "
                              f"{source!r}")
        if not seconds_per_token >= 0 or seconds_per_token == float("inf"):
            raise ConfigError(f"prefill seconds per token must be a finite number >= 0, got "
                              f"{seconds_per_token!r}: pass e.g. 2.5e-5")
        with self._lock:
            self._fallback = (float(seconds_per_token), source)
            self._use(*self._fallback)

    def hold(self, host_tokens: int, disk_tokens: int) -> float:
        """Hit tokens a lookup found in the host and disk tiers while the cost looked
        unknown: held, and credited at the next known cost, unless one is known now.

        Returns the cost to credit them at now (a known cost, 0 included; the caller
        counts them), or 0.0 when they were held.
        """
        with self._lock:
            if self.source != "none":  # known since the caller read it
                return self.seconds_per_token
            self.held_host_tokens += host_tokens
            self.held_disk_tokens += disk_tokens
            return 0.0

    def _use(self, seconds_per_token: float, source: str) -> None:
        """Make this the cost (under the lock); a known one credits the held tokens."""
        self.seconds_per_token, self.source = seconds_per_token, source
        if source != "none" and (self.held_host_tokens or self.held_disk_tokens):
            self.backlog_host_s += self.held_host_tokens * seconds_per_token
            self.backlog_disk_s += self.held_disk_tokens * seconds_per_token
            self.held_host_tokens = self.held_disk_tokens = 0

    def observe_step(self, seconds: float, prefill_tokens: int, decode_tokens: int) -> None:
        """One engine step took ``seconds`` for ``prefill_tokens`` + ``decode_tokens``.

        The normal equations are updated in place, unrolled (the matrix is symmetric:
        six sums, not nine), those of the steps with prefill as well on such a step:
        one to two microseconds; the solve runs every :data:`_SOLVE_EVERY`-th
        observation.
        """
        p, d, y = float(prefill_tokens), float(decode_tokens), seconds
        f = _FORGET
        with self._lock:
            self._yty = _accumulate(self._xtx, self._xty, self._yty, f, p, d, y)
            self._steps += 1
            if prefill_tokens:
                self._prefill_steps += 1
                g = f ** (self._steps - self._prefill_at)
                self._prefill_at = self._steps
                self._pyty = _accumulate(self._pxtx, self._pxty, self._pyty, g, p, d, y)
            if self._prefill_steps >= _MIN_STEPS and self._steps % _SOLVE_EVERY == 0:
                self._refit()

    def _refit(self) -> None:
        """Solve the fit; use its cost while its relative error is small (a first
        measured cost after :data:`_PASSES` passing solves in a row)."""
        fit = _solve3(self._xtx, self._xty)
        error = self._error(fit)
        self.relative_error = error
        passed = fit is not None and error <= MAX_RELATIVE_ERROR
        self._passes = self._passes + 1 if passed else 0
        if fit is not None and passed and (self.source == "measured"
                                           or self._passes >= _PASSES):
            self._use(fit[1], "measured")
        elif not passed and self.source == "measured":
            self._use(*self._fallback)

    def _error(self, fit: list[float] | None) -> float:
        """The fit's relative error (:func:`_relative_error`) over all steps and the
        steps with prefill."""
        return _relative_error((self._xtx, self._xty, self._yty), self._prefill_sums(), fit)

    def _prefill_sums(self) -> tuple[list[list[float]], list[float], float]:
        """The normal equations of the steps with prefill, their forgetting caught up
        over the steps since the last one."""
        fade = _FORGET ** (self._steps - self._prefill_at)
        return ([[fade * v for v in row] for row in self._pxtx],
                [fade * v for v in self._pxty], fade * self._pyty)


def _residual(sums: tuple[list[list[float]], list[float], float], fit: list[float]) -> float:
    """Sum of squared residuals of ``fit`` over the steps whose normal equations are
    ``sums``: ``y'y - 2 b'X'y + b'X'X b`` (at least 0)."""
    xtx, xty, yty = sums
    quadratic = sum(fit[i] * fit[j] * xtx[i][j] for i in range(3) for j in range(3))
    return max(yty - 2 * sum(b * v for b, v in zip(fit, xty, strict=True)) + quadratic, 0.0)


def _t95(dof: float) -> float:
    """Student's t 97.5% quantile at ``dof`` degrees of freedom (Cornish-Fisher: within
    0.6% from 6 on, the fewest the fit sees at 8 prefill steps; low below)."""
    z = _Z95
    return z + (z**3 + z) / (4 * dof) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * dof**2)


def _relative_error(steps: tuple[list[list[float]], list[float], float],
                    prefill: tuple[list[list[float]], list[float], float],
                    fit: list[float] | None) -> float:
    """Standard error of the prefill coefficient over its value, times ``t / z`` (inf: no
    usable fit). ``steps`` and ``prefill`` are the normal equations ``(X'X, X'y, y'y)``
    of all steps and of the steps with prefill.

    The residual variance is the larger of the one over all steps (``RSS / (n - 3)``) and
    the one over the steps with prefill (``RSS_p / (n_p - 2)``): the coefficient's
    variance ``(X'X)^-1 X' S X (X'X)^-1`` at the prefill term is at most that variance
    times ``(X'X)^-1`` there wherever no step varies more, and it is the prefill steps
    that fix the coefficient (on a loaded CPU they also vary the most). Few prefill steps
    give a poor estimate of their variance: the error is scaled by Student's t at
    ``n_p - 2`` degrees of freedom over the normal's 1.96, so that 0.1 still means a 95%
    interval of +-20%. ``n`` and ``n_p`` are forgetting-weighted counts.
    """
    if fit is None or fit[1] <= 0:
        return float("inf")
    xtx = steps[0]
    n, n_prefill = xtx[0][0], prefill[0][0][0]
    column = _solve3(xtx, [0.0, 1.0, 0.0])
    if n <= 3 or n_prefill <= 3 or column is None or column[1] <= 0:
        return float("inf")
    variance = max(_residual(steps, fit) / (n - 3), _residual(prefill, fit) / (n_prefill - 2))
    return float((variance * column[1]) ** 0.5 / fit[1] * _t95(n_prefill - 2) / _Z95)


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


def _accumulate(xtx: list[list[float]], xty: list[float], yty: float, forget: float,
                p: float, d: float, y: float) -> float:
    """Add the observation ``y = a + b p + c d`` to the normal equations ``xtx`` /
    ``xty`` (in place), the older ones weighed down by ``forget``; return the new
    ``y . y``."""
    row0, row1, row2 = xtx
    row0[0] = forget * row0[0] + 1.0
    row0[1] = row1[0] = forget * row0[1] + p
    row0[2] = row2[0] = forget * row0[2] + d
    row1[1] = forget * row1[1] + p * p
    row1[2] = row2[1] = forget * row1[2] + p * d
    row2[2] = forget * row2[2] + d * d
    xty[0] = forget * xty[0] + y
    xty[1] = forget * xty[1] + p * y
    xty[2] = forget * xty[2] + d * y
    return forget * yty + y * y
