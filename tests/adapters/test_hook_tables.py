"""The declarative hook tables: what instrument() installs, guards and unwraps."""

from __future__ import annotations

import asyncio
import inspect

import pytest
from structlog.testing import capture_logs

from kvobs.adapters._hooks import AdapterSpec, Hook, Instrumentation, instrument
from kvobs.recorder import Recorder, TierRecorder
from kvobs.testing import Conformance


class Pool:
    """A toy engine pool: allocate, cache on free, hit, evict; plus an async read."""

    def __init__(self, blocks: int) -> None:
        self.free_ids = list(range(blocks))
        self.cached: dict[str, int] = {}
        self.used = 0

    def get_new_blocks(self, num_blocks):
        if num_blocks > len(self.free_ids):
            raise MemoryError("pool exhausted")
        self.used += num_blocks
        return [self.free_ids.pop() for _ in range(num_blocks)]

    def free_blocks(self, blocks, keys=()):
        for block, key in zip(blocks, keys, strict=False):
            self.cached[key] = block
        self.used -= len(blocks)
        self.free_ids.extend(blocks[len(self.cached):])

    def touch(self, keys):
        found = [k for k in keys if k in self.cached]
        for key in found:
            del self.cached[key]
        self.used += len(found)
        return found

    async def read(self, key):
        return self.cached.get(key)


def _freed(inst, state, result, blocks, keys=()):
    cached = min(len(keys), len(blocks))
    inst.tier.free(cached, cached=True)
    inst.tier.free(len(blocks) - cached)


def _touched(inst, state, result, keys):
    inst.tier.reuse(len(result))


def _read(inst, state, result, key):
    inst.rec.lookup(1, gpu_hit=int(result is not None))


SPEC = AdapterSpec("test.pool", ("Pool",), (
    Hook("get_new_blocks", ("num_blocks",), "allocate", count="num_blocks"),
    Hook("free_blocks", ("blocks",), "free", after=_freed),
    Hook("touch", ("keys",), "reuse", after=_touched, reiterable=("keys",)),
    Hook("read", ("key",), "lookup", after=_read),
    Hook("missing_in_this_version", (), "track", optional=True),
))


def start(pool: Pool, rec: Recorder) -> Instrumentation:
    return instrument(pool, SPEC, lambda active: Instrumentation(
        pool, SPEC.component, active, rec, rec.add_tier("gpu", 8, 16, 64)))


def test_a_table_counts_every_event_and_the_kit_agrees():
    rec, pool = Recorder(), Pool(8)
    inst = start(pool, rec)
    kit = Conformance(rec, truth=lambda: {"gpu": (pool.used, len(pool.cached))})
    blocks = pool.get_new_blocks(3)
    kit.check("allocate")
    pool.free_blocks(blocks, keys=("a", "b"))
    kit.check("free")
    assert pool.touch(k for k in ("a", "z")) == ["a"]  # a generator: read twice, unconsumed
    kit.check("touch")
    assert asyncio.run(pool.read("b")) == blocks[1]
    assert rec.snapshot().lookups.gpu_hit == 1
    assert set(inst.wrapped_methods) == {"get_new_blocks", "free_blocks", "touch", "read"}


def test_count_hooks_get_the_engine_signature_and_engine_errors_pass_through():
    rec, pool = Recorder(), Pool(2)
    start(pool, rec)
    assert tuple(inspect.signature(pool.get_new_blocks).parameters) == ("num_blocks",)
    assert pool.get_new_blocks(num_blocks=1) == [1]
    with pytest.raises(MemoryError, match="pool exhausted"):
        pool.get_new_blocks(5)
    assert rec.snapshot().tier("gpu").allocations == 1  # a failed engine call counts nothing


def test_a_count_hook_counts_by_position_or_keyword() -> None:
    """The count wrapper calls the tier's event method with the counted argument, given
    by position or by keyword."""
    rec, pool, tier = Recorder(), Pool(8), TierRecorder("gpu", 8, 16, 64)
    instrument(pool, SPEC, lambda active: Instrumentation(pool, SPEC.component, active, rec,
                                                          tier))
    pool.get_new_blocks(3)
    pool.get_new_blocks(num_blocks=2)
    assert tier.allocations == 5 and rec.snapshot().errors == {}


def test_a_count_the_counters_cannot_add_is_an_error_not_an_exception() -> None:
    class LaxPool:
        def get_new_blocks(self, num_blocks):
            return [0] * int(num_blocks)

    rec, pool = Recorder(), LaxPool()
    tier = rec.add_tier("gpu", 8, 16, 64)
    spec = AdapterSpec("test.lax", ("LaxPool",), (SPEC.hooks[0],))
    instrument(pool, spec, lambda active: Instrumentation(pool, spec.component, active, rec,
                                                          tier))
    assert pool.get_new_blocks("2") == [0, 0]  # the engine's result, untouched
    assert tier.allocations == 0 and rec.snapshot().errors == {"test.lax": 1}


def test_a_failing_reader_is_counted_and_the_engine_result_is_untouched():
    def broken(inst, state, result, keys):
        raise RuntimeError("reader bug")

    spec = AdapterSpec("test.broken", ("Pool",), (Hook("touch", ("keys",), "reuse",
                                                       before=lambda inst, keys: 1 / 0),
                                                  Hook("free_blocks", ("blocks",), "free",
                                                       after=broken)))
    rec, pool = Recorder(), Pool(4)
    instrument(pool, spec, lambda active: Instrumentation(pool, spec.component, active, rec))
    with capture_logs() as logs:
        pool.free_blocks(pool.get_new_blocks(2), keys=("a",))
        assert pool.touch(["a"]) == ["a"]
    assert rec.snapshot().errors == {"test.broken": 2}
    assert [e["event"] for e in logs] == ["instrumentation_error",  # rate-limited log
                                          "kvobs_hook_disabled", "kvobs_hook_disabled"]


def test_unknown_versions_install_nothing_and_unwrap_restores():
    class Pool2(Pool):
        def free_blocks(self, ordered):  # a renamed parameter: another engine version
            return None

    rec = Recorder()
    with capture_logs() as logs:
        inst = start(Pool2(4), rec)
    assert not inst.active and inst.wrapped_methods == ()
    assert "does not start with (blocks)" in logs[0]["problems"][0]
    pool = Pool(4)
    start(pool, rec).unwrap()
    assert pool.get_new_blocks.__func__ is Pool.get_new_blocks


def test_a_hook_outside_the_vocabulary_is_refused_at_definition():
    with pytest.raises(ValueError, match="not in the vocabulary"):
        Hook("alloc", ("n",), "allocated")
    with pytest.raises(ValueError, match="count= needs"):
        Hook("alloc", ("n",), "free", count="n")


class Stepper:
    """A toy engine method called every step, with something to read on some steps."""

    def step(self, output):
        return output

    def step_kw(self, output, *, flag=False):  # keyword-only: the *args wrapper
        return output

    async def step_async(self, output):
        return output


@pytest.mark.parametrize("method", ["step", "step_kw", "step_async"])
def test_a_gate_calls_no_reader_when_false_and_a_failing_gate_is_counted(method):
    """``when``: readers run only where the gate holds (and then both, before and after);
    a gate that raises reads nothing, counts one error, and the engine call goes on."""
    seen = []

    def before(inst, output, *args, **kwargs):
        seen.append(("before", output))

    def after(inst, state, result, output, *args, **kwargs):
        seen.append(("after", result))

    def due(inst, output, *args, **kwargs):
        return output["due"]

    spec = AdapterSpec("test.gate", ("Stepper",), (
        Hook(method, ("output",), "track", before=before, after=after, when=due),))
    rec, stepper = Recorder(), Stepper()
    instrument(stepper, spec, lambda active: Instrumentation(stepper, spec.component, active,
                                                            rec))
    call = getattr(stepper, method)
    run = asyncio.run if method == "step_async" else (lambda value: value)
    outputs = [{"due": False}, {"due": True}, {}, {"due": True}]
    with capture_logs():
        results = [run(getattr(stepper, method)(output)) for output in outputs]
    assert results == outputs, "the engine's results pass through, gated or not"
    assert seen == [("before", {"due": True}), ("after", {"due": True})]
    assert rec.snapshot().errors == {"test.gate": 1}  # {}['due'] raised: read nothing
    assert getattr(stepper, method).__func__ is getattr(Stepper, method)  # and retired
    assert call.__wrapped__.__func__ is getattr(Stepper, method)


class Worker:
    """A toy engine method whose gated parameter has a default, and takes ``*rest``."""

    def work(self, n, flag=None, *rest):
        return n


def test_a_gate_reads_the_engine_s_defaults_as_a_reader_declares_them():
    """A gate over a parameter the call leaves out reads the default the gate declares
    (the engine method's own), with or without the ``*rest`` the engine takes."""
    seen = []

    def flagged(inst, n, flag=None, *rest):
        return flag

    spec = AdapterSpec("test.gate", ("Worker",), (
        Hook("work", ("n", "flag"), "track", after=lambda inst, state, result, n, *a, **k:
             seen.append(n), when=flagged),))
    rec, worker = Recorder(), Worker()
    instrument(worker, spec, lambda active: Instrumentation(worker, spec.component, active,
                                                           rec))
    assert [worker.work(1), worker.work(2, True), worker.work(3, None, "x")] == [1, 2, 3]
    assert seen == [2] and rec.snapshot().errors == {}


def test_a_gate_that_is_no_reader_is_refused_at_definition():
    with pytest.raises(TypeError, match="not callable"):
        Hook("step", ("output",), "track", when="output[")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="count= needs"):
        Hook("alloc", ("n",), "allocate", count="n", when=lambda inst, n: n)


def test_rewrap_swaps_the_readers_and_unwrap_still_restores_the_engine_method():
    rec, pool = Recorder(), Pool(8)
    inst = start(pool, rec)
    blocks = pool.get_new_blocks(2)
    inst.rewrap(Hook("free_blocks", ("blocks",), "free",
                     after=lambda inst, state, result, blocks, keys=(): inst.tier.free(99)))
    pool.free_blocks(blocks)
    assert rec.snapshot().tier("gpu").frees == 99, "the new readers run"
    inst.unwrap()
    inst.rewrap(SPEC.hooks[1])  # nothing wrapped any more: nothing installed
    assert pool.free_blocks.__func__ is Pool.free_blocks
