"""What kvobs reads of an engine, said where a person looks: one line at enable, and
two series at every scrape.

Each part of an engine's instrumentation (an :class:`~kvobs.adapters.api.Instrumentation`)
checks the methods and fields it reads; where they differ it turns itself off with its
reasons (``problems``), and a hook whose reader fails at run time retires
(``retired``). :func:`log_instrumented` logs ``kvobs_instrumented``, naming the engine, its
release, the releases kvobs was tested on (:mod:`kvobs.adapters.versions`) and every part
on or off with the reason; :func:`info_source` exports ``kvobs_engine_info`` and
``kvobs_part_enabled`` (read at each collection, so a hook that retired later reads 0).

Example:
    >>> from kvobs.adapters.api import Instrumentation
    >>> steps = Instrumentation(object(), "vllm.scheduler_steps", active=False)
    >>> steps.problems = ["Scheduler.schedule is missing"]
    >>> [str(state) for state in part_states([steps])]
    ['step_timing off (Scheduler.schedule is missing)']
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kvobs.adapters import versions
from kvobs.adapters.api import Instrumentation

#: Each instrumentation component as the part of the engine a person knows it by.
PARTS: dict[str, str] = {
    "vllm.block_pool": "gpu_tier",
    "vllm.kv_cache_manager": "lookups",
    "vllm.cpu_offloading_manager": "host_tier",
    "vllm.offloading_connector": "transfers",
    "vllm.scheduler_steps": "step_timing",
    "vllm.offloading_worker": "transfer_seconds",
    "vllm.tiering_manager": "tiering",
    "vllm.secondary_tier": "secondary_tiers",
    "vllm.hisparse": "hisparse",
    "vllm.hisparse_stats": "hisparse_stats",
}


@dataclass(frozen=True)
class PartState:
    """One part of an engine's instrumentation: on, or off and why."""

    part: str
    on: bool
    why: str = ""

    def __str__(self) -> str:
        return f"{self.part} on" if self.on else f"{self.part} off ({self.why})"


def part_states(parts: Iterable[Instrumentation]) -> list[PartState]:
    """The state of each part, in order; a component seen twice (two pools) once, off
    where any of its instances is."""
    states: dict[str, PartState] = {}
    for inst in parts:
        name = PARTS.get(inst.component, inst.component)
        if not inst.active:
            state = PartState(name, False, "; ".join(inst.problems) or "not instrumented")
        elif inst.retired:
            state = PartState(name, False, f"a reader failed in {', '.join(inst.retired)}")
        else:
            state = PartState(name, True)
        if name not in states or states[name].on:
            states[name] = state
    return list(states.values())


def release(engine: str) -> tuple[str, str]:
    """The installed release of ``engine`` and its support (``tested``, ``untested``,
    ``older``); ``("unknown", "untested")`` where no package of it is installed."""
    found = versions.installed(engine)
    if found is None:
        return "unknown", versions.UNTESTED
    return found, versions.support(engine, found)


def log_instrumented(logger: Any, engine: str, parts: Iterable[Instrumentation],
                **labels: str) -> None:
    """One ``kvobs_instrumented`` line: the engine, its release and support, the releases
    kvobs was tested on, and each part on or off with the reason."""
    found, support = release(engine)
    logger.info("kvobs_instrumented", engine=engine, version=found, support=support,
                tested=versions.tested_versions(engine),
                parts="; ".join(str(state) for state in part_states(parts)), **labels)


def info_source(engine: str, parts: Callable[[], Iterable[Instrumentation]],
                ) -> Callable[[], Mapping[str, list[tuple[dict[str, str], float]]]]:
    """A series source (:meth:`~kvobs.recorder.Recorder.add_source`) exporting
    ``kvobs_engine_info`` and ``kvobs_part_enabled`` of what ``parts()`` holds at each
    collection."""
    found, support = release(engine)
    info = [({"engine_version": found, "support": support}, 1.0)]

    def series() -> Mapping[str, list[tuple[dict[str, str], float]]]:
        return {"kvobs_engine_info": info,
                "kvobs_part_enabled": [({"part": state.part}, float(state.on))
                                       for state in part_states(parts())]}

    return series
