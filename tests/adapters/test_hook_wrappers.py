"""The one wrapper every hook gets: the readers it is given, in order (gate, re-listed
arguments, before, the engine call, after), with positional and keyword arguments,
defaults and iterators; the engine's results and exceptions untouched; a failing reader
counted once and its hook retired; sync and async methods alike."""

from __future__ import annotations

import asyncio
import copy
import gc
import inspect
import weakref

import pytest
from structlog.testing import capture_logs

from kvobs.adapters import _hooks
from kvobs.adapters._hooks import AdapterSpec, Hook, Instrumentation, attr_path, instrument
from kvobs.recorder import Recorder


class Engine:
    """An engine object whose methods take positional, keyword and defaulted arguments."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def store(self, keys, req, success=True):
        keys = list(keys)  # the engine consumes an iterator itself
        self.calls.append(("store", keys, req, success))
        return len(keys)

    def load(self, keys, *, pinned=False):
        if keys == ["boom"]:
            raise LookupError("engine failure")
        self.calls.append(("load", list(keys), pinned))
        return list(keys)


def called_with(method: str, keys, args, kwargs) -> dict:
    """The engine method's arguments as a reader got them, defaults applied (a generated
    Python wrapper passes defaults on by position, the C one passes the call as made)."""
    bound = inspect.signature(getattr(Engine, method)).bind(None, list(keys), *args, **kwargs)
    bound.apply_defaults()
    return {name: value for name, value in bound.arguments.items() if name != "self"}


def spec_with(seen: list, before=None, after=None, when=None) -> AdapterSpec:
    def reading_before(inst, keys, *args, **kwargs):
        seen.append(("before", called_with("store", keys, args, kwargs)))
        return "state"

    def reading_after(inst, state, result, keys, *args, **kwargs):
        method = "store" if isinstance(result, int) else "load"
        seen.append(("after", state, result, called_with(method, keys, args, kwargs)))

    return AdapterSpec("test.engine", ("Engine",), (
        Hook("store", ("keys", "req"), "store", before=before or reading_before,
             after=after or reading_after, reiterable=("keys",), when=when),
        Hook("load", ("keys",), "reuse", after=after or reading_after, reiterable=("keys",)),
    ))


def start(engine: Engine, spec: AdapterSpec, rec: Recorder) -> Instrumentation:
    return instrument(engine, spec, lambda active: Instrumentation(engine, spec.component,
                                                                  active, rec))


def test_the_wrapper_carries_the_engine_methods_name_and_signature():
    engine = Engine()
    start(engine, spec_with([]), Recorder())
    assert engine.store.__name__ == "store" and engine.store.__wrapped__.__func__ is Engine.store
    assert inspect.signature(engine.store) == inspect.signature(Engine().store)
    assert type(engine.store) is type(engine.load)  # one kind of wrapper, whatever the hook


def test_readers_see_every_argument_as_the_engine_got_it():
    seen: list = []
    engine = Engine()
    start(engine, spec_with(seen), Recorder())
    assert engine.store(iter(["a", "b"]), "r1") == 2  # an iterator: read twice, unconsumed
    assert engine.store(("c",), req="r2", success=False) == 1
    assert engine.load(keys=["d"], pinned=True) == ["d"]
    assert engine.calls == [("store", ["a", "b"], "r1", True), ("store", ["c"], "r2", False),
                            ("load", ["d"], True)]
    first = {"keys": ["a", "b"], "req": "r1", "success": True}
    second = {"keys": ["c"], "req": "r2", "success": False}
    assert seen == [("before", first), ("after", "state", 2, first),
                    ("before", second), ("after", "state", 1, second),
                    ("after", None, ["d"], {"keys": ["d"], "pinned": True})]


class Truth:
    """A gate value whose truth raises ``error``."""

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def __bool__(self) -> bool:
        raise self.error


def by_req(inst, keys, req, *args, **kwargs):
    return req


@pytest.mark.parametrize("when", [by_req, attr_path("due")], ids=["parameter", "attribute"])
def test_a_gate_reads_only_where_it_holds(when):
    """A ``when`` gate (a reader of the call's arguments, or of the instrumentation's own
    state) reads nothing where it is false; a BaseException from it passes through
    without calling the engine; an Exception from it is one error counted, the engine
    gets its call as made, and the hook retires."""
    seen: list = []
    spec = spec_with(seen, when=when)
    rec, engine = Recorder(), Engine()
    inst = start(engine, spec, rec)

    def gate(value):  # the gate's value for the next call, and the call's req
        inst.due = value
        return value if when is by_req else "r"

    with capture_logs():
        assert engine.store(iter(["a"]), gate(0)) == 1           # closed
        assert engine.store(["b"], gate(1)) == 1                 # open: read
        with pytest.raises(KeyboardInterrupt):
            engine.store(["d"], gate(Truth(KeyboardInterrupt())))
        assert engine.store(["c"], gate(Truth(ValueError()))) == 1   # raises: counted
    assert [call[1] for call in engine.calls] == [["a"], ["b"], ["c"]]
    assert [entry[0] for entry in seen] == ["before", "after"]
    assert seen[0][1]["keys"] == ["b"]
    assert rec.snapshot().errors == {"test.engine": 1}
    assert engine.store.__func__ is Engine.store  # retired


def test_a_gate_must_be_a_reader_not_a_string():
    with pytest.raises(TypeError, match=r"when='inst\.due' is not callable"):
        Hook("store", ("keys",), "store", when="inst.due")  # type: ignore[arg-type]


def test_an_attribute_path_reader_reads_its_first_arguments_attribute():
    """``attr_path`` as a ``before``: its first argument's dotted attribute is the state
    ``after`` gets, whatever else the call passes; a missing attribute is one error, the
    engine call goes on and the hook retires."""
    read = _hooks.attr_path("target.version")
    seen: list = []
    spec = spec_with(seen, before=read,
                     after=lambda inst, state, result, *args, **kwargs: seen.append(state))
    rec, engine = Recorder(), Engine()
    start(engine, spec, rec)
    engine.version = 1
    assert engine.store(iter(["a"]), "r1") == 1
    engine.version = 2
    assert engine.store(["b"], req="r2", success=False) == 1
    assert seen == [1, 2]
    del engine.version  # the before raises AttributeError
    with capture_logs():
        assert engine.store(["c"], "r3") == 1
    assert len(seen) == 2 and rec.snapshot().errors == {"test.engine": 1}
    for bad in ("target..calls", ""):
        with pytest.raises(ValueError, match="dotted path"):
            _hooks.attr_path(bad)
    assert copy.copy(read) is read and copy.deepcopy(read) is read  # as a function is kept


def test_a_gate_on_an_exhausted_iterator_reports_its_stop_iteration():
    """A gate reading ``next(inst.ticks)`` on an iterator that ran out: one error, the
    engine call goes on, and the error is the iterator's own ``StopIteration``."""
    def ticks():
        return "done"
        yield True  # a generator that returns at once

    spec = spec_with([], when=lambda inst, *args, **kwargs: next(inst.ticks))
    rec, engine = Recorder(), Engine()
    inst = start(engine, spec, rec)
    inst.ticks = ticks()
    with capture_logs() as logs:
        assert engine.store(["a"], "r") == 1
    assert engine.calls == [("store", ["a"], "r", True)]
    assert rec.snapshot().errors == {"test.engine": 1}
    assert [log["error"] for log in logs if log["event"] == "instrumentation_error"] == \
        ["StopIteration('done')"]


def test_a_failing_before_reads_nothing_after_and_the_engine_call_goes_on():
    seen: list = []
    rec, engine = Recorder(), Engine()
    start(engine, spec_with(seen, before=lambda inst, keys, *a, **k: 1 / 0), rec)
    with capture_logs():
        assert engine.store(["a"], "r") == 1
    assert engine.calls == [("store", ["a"], "r", True)]
    assert seen == [] and rec.snapshot().errors == {"test.engine": 1}


def test_a_failing_after_is_counted_and_the_result_is_untouched():
    def broken(inst, state, result, keys, *args, **kwargs):
        raise RuntimeError("reader bug")

    rec, engine = Recorder(), Engine()
    start(engine, spec_with([], after=broken), rec)
    with capture_logs() as logs:
        assert engine.store(["a", "b"], "r") == 2
        assert engine.load(["c"]) == ["c"]
    assert rec.snapshot().errors == {"test.engine": 2}
    assert logs[0]["event"] == "instrumentation_error"


def test_engine_exceptions_pass_through_and_nothing_is_read_after():
    seen: list = []
    rec, engine = Recorder(), Engine()
    start(engine, spec_with(seen), rec)
    with pytest.raises(LookupError, match="engine failure"):
        engine.load(["boom"])
    assert seen == [] and rec.snapshot().errors == {}
    with capture_logs(), pytest.raises(TypeError):
        engine.store()  # the engine's own TypeError for a call it does not take
    assert seen == []


def test_calls_the_engine_refuses_reach_it_as_made():
    """Too many arguments, an unknown or repeated keyword: the engine raises its own
    TypeError, and no reader reads anything of the call (a reader that cannot take the
    call fails first: counted, and the hook retires)."""
    seen: list = []
    engine = Engine()
    start(engine, spec_with(seen), Recorder())
    for args, kwargs in ((([], "r", True, "extra"), {}), ((["a"],), {"req": "r", "nope": 1}),
                         ((["a"], "r"), {"req": "again"})):
        with capture_logs(), pytest.raises(TypeError):
            engine.store(*args, **kwargs)
    assert seen == [] and engine.calls == []
    engine = Engine()
    start(engine, spec_with(seen), Recorder())
    assert engine.store(keys=["k"], success=False, req="r") == 1  # keywords in any order
    bound = {"keys": ["k"], "req": "r", "success": False}
    assert seen == [("before", bound), ("after", "state", 1, bound)]


def test_a_copied_engine_keeps_the_wrapper_as_a_function_is_kept():
    engine = Engine()
    start(engine, spec_with([]), Recorder())
    assert copy.copy(engine.store) is engine.store
    assert copy.deepcopy(engine.store) is engine.store


def test_a_base_exception_in_a_reader_is_not_swallowed():
    def interrupted(inst, state, result, keys, *args, **kwargs):
        raise KeyboardInterrupt

    engine = Engine()
    start(engine, spec_with([], after=interrupted), Recorder())
    with pytest.raises(KeyboardInterrupt):
        engine.load(["a"])


def test_unwrap_restores_and_the_wrapper_does_not_leak_the_engine():
    engine = Engine()
    inst = start(engine, spec_with([]), Recorder())
    inst.unwrap()
    assert engine.store.__func__ is Engine.store
    engine = Engine()
    start(engine, spec_with([]), Recorder())  # engine -> wrapper -> inst -> engine: a cycle
    gone = weakref.ref(engine)
    del engine
    gc.collect()
    assert gone() is None


def test_a_hook_whose_reader_failed_retires_with_one_line_and_reads_no_more():
    """A reader that raises once (an engine whose objects changed shape) would raise on
    every call: the hook puts the engine's method back and says so once; the other hooks
    keep reading, and unwrap() still restores everything."""
    calls = []

    def broken(inst, state, result, keys, *args, **kwargs):
        calls.append(keys)
        raise AttributeError("'Output' object has no attribute 'resumed_req_ids'")

    seen: list = []
    rec, engine = Recorder(), Engine()
    spec = spec_with(seen, after=broken)
    inst = start(engine, spec, rec)
    with capture_logs() as logs:
        for _ in range(3):
            assert engine.store(["a"], "r") == 1
    assert len(calls) == 1 and rec.snapshot().errors == {"test.engine": 1}
    assert engine.store.__func__ is Engine.store and inst.wrapped_methods == ("load",)
    retired = [log for log in logs if log["event"] == "kvobs_hook_disabled"]
    assert len(retired) == 1 and retired[0]["method"] == "store"
    assert "resumed_req_ids" in retired[0]["error"]
    inst.unwrap()
    assert engine.load.__func__ is Engine.load


class AsyncEngine:
    async def store(self, keys, req, success=True):
        await asyncio.sleep(0)
        return len(list(keys))


def test_a_coroutine_method_gets_the_same_readers_awaited():
    seen: list = []
    engine = AsyncEngine()
    spec = AdapterSpec("test.engine", ("AsyncEngine",), (
        Hook("store", ("keys", "req"), "store",
             before=lambda inst, keys, *a, **k: ("before", list(keys)),
             after=lambda inst, state, result, *a, **k: seen.append((state, result)),
             reiterable=("keys",)),))
    start(engine, spec, Recorder())
    assert inspect.iscoroutinefunction(engine.store)
    assert asyncio.run(engine.store(iter(["a", "b"]), "r")) == 2
    assert seen == [(("before", ["a", "b"]), 2)]
