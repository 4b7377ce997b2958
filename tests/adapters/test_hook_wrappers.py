"""The three before / after wrappers do the same thing to an engine call: the C one
(``kvobs.kernels._native.HookCall``, where the extension is built), the Python one
generated with the engine method's own signature (its fallback, and where there is no
extension) and the ``*args`` one (for signatures neither can copy). The same readers,
arguments, results, errors and exceptions, with positional and keyword arguments,
defaults and iterators."""

from __future__ import annotations

import copy
import gc
import inspect
import weakref

import pytest
from structlog.testing import capture_logs

from kvobs.adapters import _hooks
from kvobs.adapters._hooks import AdapterSpec, Hook, Instrumentation, instrument
from kvobs.recorder import Recorder


@pytest.fixture(params=["native", "generated", "args"])
def wrappers(request, monkeypatch):
    """Which wrapper instrument() installs: the C one, the Python one generated with the
    engine's signature (no extension), or the ``*args`` one (what an engine method with
    ``*args`` / keyword-only parameters gets)."""
    if request.param == "native" and _hooks._HookCall is None:
        pytest.skip("the C extension is not built here")
    if request.param != "native":
        monkeypatch.setattr(_hooks, "_HookCall", None)
    if request.param == "args":
        monkeypatch.setattr(_hooks, "_plain_params", lambda original: None)
    return request.param


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


def test_the_wrapper_kind_is_the_one_asked_for(wrappers):
    engine = Engine()
    start(engine, spec_with([]), Recorder())
    native = _hooks._HookCall is not None and isinstance(engine.store, _hooks._HookCall)
    assert native == (wrappers == "native")
    python = engine.store.fallback if native else engine.store  # the C one's fallback
    generated = python.__code__.co_varnames[:2] == ("keys", "req")
    assert generated == (wrappers != "args")
    if generated:  # told apart from an engine's own generated code (dataclasses: <string>)
        assert python.__code__.co_filename == "<kvobs wrapper test.engine.store>"
        assert python.__name__ == "store" and python.__wrapped__.__func__ is Engine.store
    assert engine.store.__name__ == "store" and engine.store.__wrapped__.__func__ is Engine.store
    assert inspect.signature(engine.store) == inspect.signature(Engine().store)


def test_readers_see_every_argument_as_the_engine_got_it(wrappers):
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


@pytest.mark.parametrize("when", ["req", "inst.due"])
def test_a_plain_gate_reads_only_where_it_holds(wrappers, when):
    """A ``when`` of a parameter or an attribute of ``inst`` is tested by the C wrapper
    itself (it stays a HookCall). Every wrapper reads nothing where the gate is false or
    raises (an Exception: one error counted; the engine gets its call as made), and lets
    a BaseException from it through without calling the engine."""
    seen: list = []
    spec = spec_with(seen, when=when)
    rec, engine = Recorder(), Engine()
    inst = start(engine, spec, rec)
    assert isinstance(engine.store, _hooks._HookCall or ()) == (wrappers == "native")

    def gate(value):  # the gate's value for the next call, and the call's req
        inst.due = value
        return value if when == "req" else "r"

    inst.due = True
    with capture_logs():
        assert engine.store(iter(["a"]), gate(0)) == 1           # closed
        assert engine.store(["b"], gate(1)) == 1                 # open: read
        assert engine.store(["c"], gate(Truth(ValueError()))) == 1   # raises: counted
        with pytest.raises(KeyboardInterrupt):
            engine.store(["d"], gate(Truth(KeyboardInterrupt())))
    assert [call[1] for call in engine.calls] == [["a"], ["b"], ["c"]]
    assert [entry[0] for entry in seen] == ["before", "after"]
    assert seen[0][1]["keys"] == ["b"]
    assert rec.snapshot().errors == {"test.engine": 1}


@pytest.mark.parametrize("twin", ["native", "python"])
def test_an_attribute_path_reader_reads_before_in_every_wrapper(wrappers, twin, monkeypatch):
    """``attr_path`` (C ``AttrPath``, or its Python twin) as a ``before``: its first
    argument's dotted attribute is the state ``after`` gets, whatever else the call
    passes; a missing attribute is one error and the engine call goes on."""
    if twin == "python":
        monkeypatch.setattr(_hooks, "_AttrPath", None)
    elif _hooks._AttrPath is None:
        pytest.skip("the C extension is not built here")
    read = _hooks.attr_path("target.version")
    assert (type(read).__name__ == "AttrPath") == (twin == "native")
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
    with pytest.raises(ValueError, match="dotted path"):
        _hooks.attr_path("target..calls")
    assert copy.copy(read) is read and copy.deepcopy(read) is read  # as a function is kept


def test_a_gate_on_an_exhausted_iterator_reports_its_stop_iteration(wrappers):
    """``next(inst.ticks)`` on an iterator that ran out: one error, the engine call goes
    on, and the error is the iterator's own ``StopIteration`` (its value kept)."""
    def ticks():
        return "done"
        yield True  # a generator that returns at once

    spec = spec_with([], when="next(inst.ticks)")
    rec, engine = Recorder(), Engine()
    inst = start(engine, spec, rec)
    inst.ticks = ticks()
    with capture_logs() as logs:
        assert engine.store(["a"], "r") == 1
    assert engine.calls == [("store", ["a"], "r", True)]
    assert rec.snapshot().errors == {"test.engine": 1}
    assert [log["error"] for log in logs] == ["StopIteration('done')"]


def test_a_gate_python_reads_otherwise_stays_with_the_python_wrapper():
    """A parameter named ``next`` shadows the builtin, and a non-NFKC name compiles to
    another one: such gates are not given to the C wrapper."""
    assert _hooks._plain_gate("next(inst.ticks)", ("next",)) is None
    assert _hooks._plain_gate("inst.a\uff47", ()) is None
    assert _hooks._plain_gate("next(inst.ticks)", ("n",)) == (-1, "ticks", True)


def test_a_failing_before_reads_nothing_after_and_the_engine_call_goes_on(wrappers):
    seen: list = []
    rec, engine = Recorder(), Engine()
    start(engine, spec_with(seen, before=lambda inst, keys, *a, **k: 1 / 0), rec)
    with capture_logs():
        assert engine.store(["a"], "r") == 1
    assert engine.calls == [("store", ["a"], "r", True)]
    assert seen == [] and rec.snapshot().errors == {"test.engine": 1}


def test_a_failing_after_is_counted_and_the_result_is_untouched(wrappers):
    def broken(inst, state, result, keys, *args, **kwargs):
        raise RuntimeError("reader bug")

    rec, engine = Recorder(), Engine()
    start(engine, spec_with([], after=broken), rec)
    with capture_logs() as logs:
        assert engine.store(["a", "b"], "r") == 2
        assert engine.load(["c"]) == ["c"]
    assert rec.snapshot().errors == {"test.engine": 2}
    assert logs[0]["event"] == "instrumentation_error"


def test_engine_exceptions_pass_through_and_nothing_is_read_after(wrappers):
    seen: list = []
    rec, engine = Recorder(), Engine()
    start(engine, spec_with(seen), rec)
    with pytest.raises(LookupError, match="engine failure"):
        engine.load(["boom"])
    assert seen == [] and rec.snapshot().errors == {}
    with capture_logs(), pytest.raises(TypeError):
        engine.store()  # the engine's own TypeError for a call it does not take
    assert seen == []


def test_calls_the_wrapper_cannot_bind_reach_the_engine_as_made(wrappers):
    """Too many arguments, an unknown or repeated keyword: the engine raises its own
    TypeError and no reader runs (the C wrapper hands such calls to its fallback)."""
    seen: list = []
    engine = Engine()
    start(engine, spec_with(seen), Recorder())
    for args, kwargs in ((([], "r", True, "extra"), {}), ((["a"],), {"req": "r", "nope": 1}),
                         ((["a"], "r"), {"req": "again"})):
        with pytest.raises(TypeError):
            engine.store(*args, **kwargs)
    assert seen == [] and engine.calls == []
    assert engine.store(keys=["k"], success=False, req="r") == 1  # keywords in any order
    bound = {"keys": ["k"], "req": "r", "success": False}
    assert seen == [("before", bound), ("after", "state", 1, bound)]


def test_a_copied_engine_keeps_the_wrapper_as_a_function_is_kept(wrappers):
    engine = Engine()
    start(engine, spec_with([]), Recorder())
    assert copy.copy(engine.store) is engine.store
    assert copy.deepcopy(engine.store) is engine.store


def test_a_base_exception_in_a_reader_is_not_swallowed(wrappers):
    def interrupted(inst, state, result, keys, *args, **kwargs):
        raise KeyboardInterrupt

    engine = Engine()
    start(engine, spec_with([], after=interrupted), Recorder())
    with pytest.raises(KeyboardInterrupt):
        engine.load(["a"])


def test_unwrap_restores_and_the_wrapper_does_not_leak_the_engine(wrappers):
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


def test_a_method_with_more_parameters_than_the_c_wrapper_binds_keeps_the_python_one():
    if _hooks._HookCall is None:
        pytest.skip("the C extension is not built here")
    limit = _hooks.native.HOOK_MAX_PARAMS
    names = [f"p{i}" for i in range(limit + 1)]
    namespace: dict = {}
    exec(f"def wide(self, {', '.join(names)}): return p0", namespace)
    Wide = type("Wide", (), {"wide": namespace["wide"]})
    seen: list = []
    spec = AdapterSpec("test.wide", ("Wide",), (
        Hook("wide", ("p0",), "track", after=lambda inst, state, result, *a: seen.append(a)),))
    engine = Wide()
    instrument(engine, spec, lambda active: Instrumentation(engine, spec.component, active))
    assert not isinstance(engine.wide, _hooks._HookCall)
    assert engine.wide(*range(limit + 1)) == 0 and seen == [tuple(range(limit + 1))]


def test_the_c_wrapper_refuses_what_it_cannot_call():
    if _hooks._HookCall is None:
        pytest.skip("the C extension is not built here")
    fine = {"original": print, "params": ("a",), "defaults": None, "inst": None,
            "error": print, "component": "c", "fallback": print}
    for bad in ({"fallback": 3}, {"after": "x"}, {"count": 1, "count_at": 0}):
        with pytest.raises(TypeError, match=f"{next(iter(bad))} is not callable"):
            _hooks._HookCall(**{**fine, **bad})
    with pytest.raises(ValueError, match="count_at 1 is not a param index"):
        _hooks._HookCall(**fine, count=print, count_at=1)
    with pytest.raises(ValueError, match="a count hook has no readers"):
        _hooks._HookCall(**fine, count=print, count_at=0, after=print)
    with pytest.raises(ValueError, match="reiterable 1 is not a param index"):
        _hooks._HookCall(**fine, reiterable=(1,))
    with pytest.raises(ValueError, match="reiterable 0 is repeated"):  # past the array
        _hooks._HookCall(**fine, reiterable=(0,) * 20)
