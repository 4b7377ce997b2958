"""Which scheduler steps the vLLM step adapter times: its stride, warm-up and the turn a
due step that scheduled nothing passes on, with the gate tested in C (``next(inst.ticks)``
in a ``HookCall``) and in the Python wrapper alike.

The scheduler here is a stand-in with vLLM's two method signatures (no vLLM in this
venv): it returns the outputs it is given; what is checked is which of them reach
``Recorder.step``.
"""

from __future__ import annotations

from types import SimpleNamespace

from kvobs.adapters.vllm.steps import instrument_steps
from kvobs.recorder import Recorder


class Scheduler:
    """Stand-in for vLLM's ``Scheduler``: ``schedule()`` hands out prepared outputs."""

    def __init__(self, outputs: list[SimpleNamespace]) -> None:
        self.outputs = outputs

    def schedule(self, throttle_prefills: bool = False) -> SimpleNamespace:
        return self.outputs.pop(0)

    def update_from_output(self, scheduler_output, model_runner_output):
        return {}


def output(step: int, tokens: int) -> SimpleNamespace:
    """A decode step of one request scheduling ``tokens`` tokens (step numbers as ids)."""
    cached = SimpleNamespace(req_ids=["r"], num_output_tokens=[step], resumed_req_ids=set())
    return SimpleNamespace(step=step, total_num_scheduled_tokens=tokens,
                           num_scheduled_tokens={"r": tokens}, scheduled_new_reqs=[],
                           scheduled_cached_reqs=cached)


def timed_steps(outputs: list[SimpleNamespace], rec: Recorder, **stride: int) -> list[int]:
    """The steps whose time reached ``rec.step``."""
    scheduler = Scheduler(outputs[:])
    fed: list[int] = []
    rec.step = lambda seconds, prefill, decode: fed.append(decode)  # type: ignore[method-assign]
    inst = instrument_steps(scheduler, rec, **stride)
    timed = []
    for _ in outputs:
        out = scheduler.schedule()
        before = len(fed)
        scheduler.update_from_output(out, None)
        if len(fed) > before:
            timed.append(out.step)
    assert fed == [1] * len(timed) and not inst.in_flight
    return timed


def test_timed_steps_follow_the_stride_and_an_empty_due_step_passes_the_turn():
    empty = {10}  # a due step that schedules nothing: step 11 takes its turn
    outputs = [output(step, 0 if step in empty else 1) for step in range(1, 16)]
    rec = Recorder()
    rec.prefill_cost.source = "measured"  # the fit has its cost: warm-up ends on time
    # warm-up every 2nd step (1, 3), then every 3rd from the step after (4, 7, 10); 10
    # scheduled nothing, so 11 is timed and the stride goes on from there (14)
    assert timed_steps(outputs, rec, every=2, warm=2, steady_every=3) == [1, 3, 4, 7, 11, 14]


def test_the_warm_up_goes_on_until_a_cost_is_measured_up_to_four_times_its_length():
    outputs = [output(step, 1) for step in range(1, 30)]
    # no cost yet: 4 x 2 warm-up steps every 2nd (1 ... 15), then every 3rd (16, 19, ...)
    assert timed_steps(outputs, Recorder(), every=2, warm=2, steady_every=3) == \
        [1, 3, 5, 7, 9, 11, 13, 15, 16, 19, 22, 25, 28]
