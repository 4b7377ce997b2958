"""vLLM ``Scheduler`` steps -> the measured prefill cost (:mod:`kvobs.benefit`).

The engine core runs one step as ``schedule()`` -> the model executes the
``SchedulerOutput`` -> ``update_from_output(scheduler_output, model_runner_output)``.
This adapter times each step from ``schedule()`` returning to ``update_from_output``
being called with that output (the model execution, as the scheduler process sees it)
and counts its tokens from the output: tokens of requests still prefilling (new
requests, resumed ones, and running ones with no output token yet: chunked prefill)
against decode tokens (the rest), then calls ``rec.step(seconds, prefill, decode)``,
whose fit gives ``kvobs_prefill_cost_info{source="measured"}``.

With async scheduling (vLLM's default on a GPU: two batches in flight, the next one
scheduled while the model runs the last) each output is paired with its own
``update_from_output`` call, and a batch's time starts when it was scheduled or when the
output before it came back (``update_from_output`` of that one), whichever is later: the
model runs one batch at a time, so a batch scheduled while the last one runs waits for
it. Timed from its ``schedule()`` alone, a step would also count the rest of the batch
before it (in the engine test bed the fit's relative error then stayed above 0.1: no
measured cost at all). Steps that scheduled nothing are not fed.

Every ``every``-th step (default :data:`EVERY`) is timed and fed until :data:`WARM`
observations were fed and the fit gave a measured cost (or, failing one, until
:data:`MAX_WARM` were), then every :data:`STEADY_EVERY`-th (a step that scheduled
nothing passes the turn to the next one). The dense warm-up gets the cost, and so the
host pool's saving, sooner; the wide stride keeps the fit's few microseconds an
observation off most steps (several percent of a small step if every step were fed). A
fixed stride selects steps independently of their time, so the least-squares fit stays
unbiased; it only needs more steps to reach the same precision (the cost changes slowly:
a model, a batch shape). An untimed step calls no reader: each wrapper tests one inline
gate (the stride's next tick, an empty ``in_flight``).

Example (needs vLLM)::

    inst = instrument_steps(scheduler, rec)
    ...  # the engine loop
    rec.prefill_cost.source            # "measured" after 8 or more steps with prefill
"""

from __future__ import annotations

from functools import cache
from itertools import cycle
from time import perf_counter
from typing import Any

from kvobs.adapters.api import AdapterSpec, Hook, Instrumentation, attr_path, instrument
from kvobs.recorder import Recorder

COMPONENT = "vllm.scheduler_steps"
#: Outputs waiting for their ``update_from_output`` (async scheduling keeps two).
MAX_IN_FLIGHT = 8
#: Time one step in this many while the fit warms up (see the module docstring).
EVERY = 4
#: Observations fed at ``EVERY`` before the stride widens, once a cost is measured.
WARM = 256
#: How many times ``WARM`` the warm-up lasts at most while no cost gets measured.
UNMEASURED_WARM = 4
#: Observations fed at ``EVERY`` before the stride widens whatever the fit says.
MAX_WARM = UNMEASURED_WARM * WARM
#: Time one step in this many once warm.
STEADY_EVERY = 32


class StepInstrumentation(Instrumentation):
    """Wrappers on one ``Scheduler``: ``in_flight`` maps each scheduled output (by id) to
    ``(scheduled at, prefill tokens, decode tokens)``."""

    def __init__(self, scheduler: Any, rec: Recorder, active: bool, every: int = EVERY,
                 warm: int = WARM, steady_every: int = STEADY_EVERY) -> None:
        super().__init__(scheduler, COMPONENT, active, rec)
        self.in_flight: dict[int, tuple[float, int, int]] = {}
        self.steady_every = max(int(steady_every), 1)
        self.warm = warm  # timed steps left at ``every`` once a cost is measured
        self.max_warm = UNMEASURED_WARM * warm  # ... or whatever the fit says
        #: the stride now: ``every`` while warming up, then ``steady_every``
        self.every = max(int(every), 1) if warm > 0 else self.steady_every
        #: the gate: True every ``every``-th step, the first one first (a due step that
        #: scheduled nothing starts it again, so the next step is timed)
        self.ticks = stride(self.every)


def stride(every: int) -> Any:
    """An endless iterator of bools, True first and then every ``every``-th (a new one
    after each empty due step: its pattern is built once per stride length)."""
    return cycle(_pattern(every))


@cache
def _pattern(every: int) -> tuple[bool, ...]:
    return (True,) + (False,) * (every - 1)


_NONE: frozenset[str] = frozenset()


def step_tokens(out: Any) -> tuple[int, int]:
    """``(prefill, decode)`` tokens a ``SchedulerOutput`` schedules."""
    counts = out.num_scheduled_tokens
    prefill = 0
    for new in out.scheduled_new_reqs:
        prefill += counts.get(new.req_id, 0)
    cached = out.scheduled_cached_reqs
    # vLLM 0.33 schedules a resumed request as a cached one and names it here; from 0.34
    # it is sent again as a new request (counted above) and the field is gone
    resumed = getattr(cached, "resumed_req_ids", _NONE)
    outputs = cached.num_output_tokens
    if resumed or 0 in outputs:  # a decode-only step skips the walk
        for req_id, n_out in zip(cached.req_ids, outputs, strict=False):
            if n_out == 0 or req_id in resumed:
                prefill += counts.get(req_id, 0)
    return prefill, out.total_num_scheduled_tokens - prefill


def _due(inst: StepInstrumentation, *args: Any, **kwargs: Any) -> bool:
    """The gate of ``schedule``: whether this step is one to time (every ``every``-th)."""
    return bool(next(inst.ticks))


def _scheduled(inst: StepInstrumentation, state: None, out: Any,
               throttle_prefills: bool = False) -> None:
    """A due step was scheduled (the gate let it through): time it from here."""
    if not out.total_num_scheduled_tokens:
        inst.ticks = stride(inst.every)  # nothing to time: the next step takes the turn
        return
    if inst.max_warm > 0:
        inst.warm -= 1
        inst.max_warm -= 1
        if not inst.max_warm or (inst.warm <= 0 and inst.rec.prefill_cost.source == "measured"):
            inst.max_warm = 0
            inst.every = inst.steady_every
            inst.ticks = stride(inst.every)
    prefill, decode = step_tokens(out)
    in_flight = inst.in_flight
    in_flight[id(out)] = (perf_counter(), prefill, decode)
    if len(in_flight) > MAX_IN_FLIGHT:  # outputs never executed (an engine shutting down)
        del in_flight[next(iter(in_flight))]


def _executed(inst: StepInstrumentation, scheduler_output: Any,
              model_runner_output: Any) -> None:
    """A timed step may be done (the gate: something is in flight). An output that came
    back while a timed step was still queued behind it (async scheduling) starts that
    step's time: the model runs one batch at a time."""
    in_flight = inst.in_flight
    started = in_flight.pop(id(scheduler_output), None)
    now = perf_counter()
    if started is not None:
        at, prefill, decode = started
        inst.rec.step(now - at, prefill, decode)
    for key, (at, prefill, decode) in in_flight.items():  # queued behind this output
        if at < now:
            in_flight[key] = (now, prefill, decode)


SPEC = AdapterSpec(COMPONENT, ("Scheduler",), (
    Hook("schedule", (), "track", after=_scheduled, when=_due),
    Hook("update_from_output", ("scheduler_output", "model_runner_output"), "track",
         before=_executed, when=attr_path("in_flight")),
))


def instrument_steps(scheduler: Any, rec: Recorder, every: int = EVERY, warm: int = WARM,
                     steady_every: int = STEADY_EVERY) -> StepInstrumentation:
    """Feed ``rec.step`` from every ``every``-th step of a vLLM v1 ``Scheduler`` for the
    first ``warm`` observations, then from every ``steady_every``-th.

    Raises:
        AdapterError: not a Scheduler, or already instrumented.
    """
    def make(active: bool) -> StepInstrumentation:
        return StepInstrumentation(scheduler, rec, active, every, warm, steady_every)

    return instrument(scheduler, SPEC, make)
