"""The one piece of machinery every engine adapter uses: declare hooks, it does the rest.

An adapter is a declarative table: an :class:`AdapterSpec` naming the engine classes it
supports and one :class:`Hook` per engine method (which vocabulary event the call means,
see :mod:`kvobs.events`, and small functions that read its arguments and result).
:func:`instrument` then, for one engine *instance*:

* checks it (class name, every hooked method and its leading parameters, the state
  attributes the readers use): an unsupported object is an :class:`AdapterError`; a
  supported class whose methods changed (an engine version kvobs does not know) logs one
  warning naming what is missing and instruments nothing, never half;
* installs a wrapper per hook as an attribute of that instance (never the class): the
  engine's results and exceptions pass through untouched; a failure in a reader is
  counted as ``kvobs_instrumentation_errors_total{component=...}`` and logged at most
  once a minute, and the engine call goes on;
* remembers what it shadowed, so ``unwrap()`` restores the object exactly.

No adapter writes recorder fields or its own ``try``/``except``: readers call the
:class:`~kvobs.events.TierEvents` / :class:`~kvobs.events.LinkEvents` methods, and a
hook that only adds one argument to a counter (``count=``) gets a generated wrapper with
the engine method's own signature, the cheapest Python can do (one call, one add);
before / after hooks on a method with plain parameters get a generated wrapper with its
signature too (no ``*args`` packing per call). Where the C extension is built, such a
wrapper is installed as its C twin, :class:`kvobs.kernels._native.HookCall`, which binds
the same parameters and calls the same readers with no Python frame of its own (a hook
whose reader is C too, such as ``count=`` on the C event counters, then runs no Python
at all); the generated wrapper stays its fallback for calls it does not bind. A ``when``
gate of a plain form, a parameter (``"num_external_tokens"``), an attribute of ``inst``
(``"inst.in_flight"``) or the next item of one (``"next(inst.ticks)"``), is tested in C
too; hooks with any other gate expression, and coroutines, keep the Python wrapper.

Example:
    >>> from kvobs.recorder import Recorder
    >>> class BlockPool:
    ...     def get_new_blocks(self, num_blocks): return [0] * num_blocks
    ...     def free_blocks(self, blocks): return None
    >>> def freed(inst, state, result, blocks):
    ...     inst.tier.free(len(blocks))
    >>> SPEC = AdapterSpec("demo.block_pool", ("BlockPool",), (
    ...     Hook("get_new_blocks", ("num_blocks",), "allocate", count="num_blocks"),
    ...     Hook("free_blocks", ("blocks",), "free", after=freed),
    ... ))
    >>> rec = Recorder()
    >>> pool = BlockPool()
    >>> inst = instrument(pool, SPEC, lambda active: Instrumentation(
    ...     pool, SPEC.component, active, rec, rec.add_tier("gpu", 8, 16, 1024)))
    >>> pool.free_blocks(pool.get_new_blocks(3))
    >>> t = rec.snapshot().tier("gpu"); (t.allocations, t.frees)
    (3, 3)
    >>> inst.unwrap()
    >>> pool.get_new_blocks.__func__ is BlockPool.get_new_blocks
    True
"""

from __future__ import annotations

import functools
import inspect
import operator
import re
import sys
import types
import unicodedata
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from kvobs.errors import KvobsError
from kvobs.events import EVENTS, NULL_TIER, TierEvents
from kvobs.kernels._ext import native
from kvobs.telemetry.logs import get_logger
from kvobs.telemetry.ratelimit import RateLimit

_log = get_logger("kvobs.adapters")

#: Attribute that marks an instrumented engine object (holds its Instrumentation).
MARKER = "_kvobs_instrumentation"

_WARNED = RateLimit(None)


class AdapterError(KvobsError, TypeError):
    """The object cannot be instrumented: wrong kind, or already instrumented."""


#: What a hook's call may mean: a vocabulary event, a prefix ``lookup``, or ``track``
#: (bookkeeping that a collection-time derivation of events reads).
HOOK_MEANINGS: tuple[str, ...] = (*EVENTS, "lookup", "track")
#: Counter a ``count=`` hook adds its argument to, per event.
COUNT_FIELDS = {"allocate": "allocations", "reuse": "reuses", "store": "stores"}

Before = Callable[..., Any]
After = Callable[..., None]


@dataclass(frozen=True)
class Hook:
    """One engine method an adapter wraps, and what its calls mean.

    Attributes:
        method: the engine method's name.
        params: its leading parameter names (after ``self``) that the readers rely on;
            checked against the engine's signature at wrap time.
        means: the vocabulary event(s) a call means, e.g. ``"allocate"`` or
            ``"reuse, allocate"`` (see :data:`HOOK_MEANINGS`).
        count: fast path: add this argument to the counter of ``means`` on
            ``inst.tier`` (one event of :data:`COUNT_FIELDS`; no readers).
        before: ``before(inst, *args, **kwargs) -> state``, read before the engine call.
        after: ``after(inst, state, result, *args, **kwargs)``, read after it returned.
        reiterable: arguments the readers iterate as well as the engine: an iterator
            passed there is turned into a list first, so reading never consumes it.
        optional: the engine may lack the method (then it is not wrapped).
        when: a Python expression over ``inst`` and ``params`` evaluated inline before
            each call (no reader call): when false, the engine method runs with no
            readers at all. For hooks called every step with nothing to read on most
            (``"inst.in_flight"``); a failing expression counts as an error and reads
            nothing.
    """

    method: str
    params: tuple[str, ...]
    means: str = ""
    count: str | None = None
    before: Before | None = None
    after: After | None = None
    reiterable: tuple[str, ...] = ()
    optional: bool = False
    when: str | None = None

    def __post_init__(self) -> None:
        words = [w.strip() for w in self.means.split(",") if w.strip()]
        unknown = [w for w in words if w not in HOOK_MEANINGS]
        if unknown:
            raise ValueError(f"Hook {self.method}: means {unknown} are not in the vocabulary "
                             f"{HOOK_MEANINGS}")
        if self.when is not None:
            compile(self.when, f"<when of {self.method}>", "eval")  # a SyntaxError here
        if self.count is not None:
            if self.means not in COUNT_FIELDS or self.before or self.after or self.when:
                raise ValueError(f"Hook {self.method}: count= needs means in "
                                 f"{tuple(COUNT_FIELDS)} and no readers")
            if self.count not in self.params:
                raise ValueError(f"Hook {self.method}: count={self.count!r} is not in params")


@dataclass(frozen=True)
class AdapterSpec:
    """An adapter: the engine classes it supports and the hooks it installs on them.

    Attributes:
        component: name in errors, warnings and ``kvobs_instrumentation_errors_total``.
        kinds: class names (of the object or a base) the adapter supports.
        hooks: the methods it wraps.
        state: dotted attribute paths its readers use (``null_block.ref_cnt``).
    """

    component: str
    kinds: tuple[str, ...]
    hooks: tuple[Hook, ...]
    state: tuple[str, ...] = ()


def signature_problems(target: object, hooks: Iterable[Hook]) -> list[str]:
    """Describe every hook whose method is missing or has unexpected parameters."""
    problems = []
    cls = type(target)
    for hook in hooks:
        method = getattr(cls, hook.method, None)
        if not callable(method):
            if not hook.optional:
                problems.append(f"{cls.__name__}.{hook.method} is missing")
            continue
        try:
            params = tuple(inspect.signature(method).parameters)[1:]  # drop self
        except (TypeError, ValueError):
            problems.append(f"{cls.__name__}.{hook.method} has no readable signature")
            continue
        if params[: len(hook.params)] != hook.params:
            problems.append(
                f"{cls.__name__}.{hook.method}({', '.join(params)}) does not start with "
                f"({', '.join(hook.params)})"
            )
    return problems


def warn_once(key: str, event: str, **fields: Any) -> None:
    """Log ``event`` once per process for ``key`` (version mismatches repeat per instance)."""
    if _WARNED.allow(key):
        _log.warning(event, **fields)


def _ignore_error(component: str, exc: BaseException | None = None) -> None:
    """Where errors go when an instrumentation has no recorder."""


class Instrumentation:
    """The wrappers installed on one engine object; :meth:`unwrap` restores it exactly.

    ``active`` is False when the object's version is unknown and nothing was installed.
    ``tier`` is the tier the object's events go to (``count=`` hooks add to it); readers
    reach the rest of the recorder through ``rec``.
    """

    def __init__(self, target: object, component: str, active: bool = True,
                 rec: Any = None, tier: TierEvents = NULL_TIER) -> None:
        self.target: Any = target
        self.component = component
        self.active = active
        self.rec = rec
        self.tier: Any = tier
        self.error: Callable[[str, BaseException | None], None] = \
            rec.error if rec is not None else _ignore_error
        self._shadowed: dict[str, tuple[bool, Any]] = {}
        self._on_unwrap: list[Callable[[], None]] = []

    def install(self, name: str, wrapper: Callable[..., Any]) -> None:
        """Shadow method ``name`` on the instance with ``wrapper``."""
        if name not in self._shadowed:
            self._shadowed[name] = _own_attribute(self.target, name)
        setattr(self.target, name, wrapper)

    def rewrap(self, hook: Hook) -> None:
        """Replace the wrapper on ``hook.method`` by one built from ``hook`` (same engine
        method beneath): for readers that change with what the engine was seen doing, e.g.
        a before-read needed only once a feature was first used. Nothing on an object
        this instrumentation does not wrap (inactive, unwrapped)."""
        if hook.method not in self._shadowed:
            return
        had_own, value = self._shadowed[hook.method]
        original = value if had_own else getattr(type(self.target), hook.method).__get__(
            self.target)
        setattr(self.target, hook.method, _wrapper(self, hook, original))

    def on_unwrap(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` when the instrumentation is removed (detach sources...)."""
        self._on_unwrap.append(callback)

    @property
    def wrapped_methods(self) -> tuple[str, ...]:
        """Names of the methods currently shadowed."""
        return tuple(self._shadowed)

    def unwrap(self) -> None:
        """Restore every shadowed method; a second call does nothing."""
        target = self.target
        for name, (had_own, value) in reversed(list(self._shadowed.items())):
            if had_own:
                setattr(target, name, value)
            elif _own_attribute(target, name)[0]:
                delattr(target, name)
        self._shadowed.clear()
        if getattr(target, MARKER, None) is self:
            delattr(target, MARKER)
        callbacks, self._on_unwrap = self._on_unwrap, []
        for callback in callbacks:
            callback()
        self.active = False

    def __repr__(self) -> str:
        state = "active" if self.active else "inactive"
        return (f"<Instrumentation {self.component} of {type(self.target).__name__} "
                f"({state}: {', '.join(self._shadowed) or 'nothing wrapped'})>")


def _own_attribute(target: object, name: str) -> tuple[bool, Any]:
    """Whether ``target`` has its own attribute ``name`` (not the class's method), and it.

    Never reads ``target.__dict__``: on CPython 3.11+ that materialises the instance dict
    and takes the engine's own ``self.x`` loads off their fast path (measured: +19% on
    ``BlockPool.get_new_blocks``). A bound method of the class's function is not "own".
    """
    current = getattr(target, name, None)
    if getattr(current, "__self__", None) is target and \
            getattr(current, "__func__", None) is getattr(type(target), name, None):
        return False, None
    return current is not None, current


def class_names(obj: object) -> set[str]:
    """Names of the object's class and its bases (duck typing without importing engines)."""
    return {cls.__name__ for cls in type(obj).__mro__}


InstT = TypeVar("InstT", bound=Instrumentation)


def begin(target: object, kinds: tuple[str, ...], hooks: Iterable[Hook], component: str,
          make: Callable[[bool], InstT], state: tuple[str, ...] = ()) -> InstT:
    """Validate ``target`` and return ``make(active)``, marked on the target when active.

    Args:
        target: the engine object to instrument.
        kinds: class names (of the object or a base) the adapter supports.
        hooks: the methods the adapter will wrap.
        component: name used in errors, warnings and the error counter.
        make: builds the Instrumentation; receives False when the version is unknown.
        state: dotted attribute paths the adapter reads (``null_block.ref_cnt``).

    Raises:
        AdapterError: ``target`` is not one of ``kinds``, cannot hold instance
            attributes, or is already instrumented.
    """
    if not class_names(target) & set(kinds):
        raise AdapterError(
            f"{component}: expected an instance of {' or '.join(kinds)}, got "
            f"{type(target).__module__}.{type(target).__qualname__}: pass the engine's own "
            "object"
        )
    if getattr(target, MARKER, None) is not None:
        raise AdapterError(
            f"{component}: this {type(target).__name__} is already instrumented by kvobs; "
            "call unwrap() on the first instrumentation before wrapping it again"
        )
    problems = signature_problems(target, hooks)
    problems += [f"{type(target).__name__}.{path} is missing" for path in state
                 if not _has_path(target, path)]
    inst = make(not problems)
    if problems:
        warn_once(f"{component}:{type(target).__qualname__}", "kvobs_adapter_unsupported_version",
                  component=component, cls=type(target).__qualname__, problems=problems,
                  action="instrumenting nothing")
        return inst
    try:
        setattr(target, MARKER, inst)
    except AttributeError:
        raise AdapterError(f"{component}: {type(target).__name__} takes no instance "
                           "attributes; kvobs cannot wrap its methods") from None
    return inst


def _has_path(obj: object, path: str) -> bool:
    for name in path.split("."):
        if not hasattr(obj, name):
            return False
        obj = getattr(obj, name)
    return True


F = TypeVar("F", bound=Callable[..., None])


def guarded(component: str) -> Callable[[F], F]:
    """Guard a callback method of an object with a ``rec`` (the generic callbacks): a
    failure inside it is counted under ``component`` and logged, never raised.

    Example:
        >>> from kvobs.recorder import Recorder
        >>> class Callbacks:
        ...     def __init__(self, rec): self.rec = rec
        ...     @guarded("mine")
        ...     def allocate(self, tier, n): self.rec.tier(tier).allocate(n)
        >>> import structlog.testing
        >>> rec = Recorder()
        >>> with structlog.testing.capture_logs() as logs:
        ...     Callbacks(rec).allocate("nvme", 1)   # an unknown tier: counted, not raised
        >>> logs[0]["event"], rec.snapshot().errors
        ('instrumentation_error', {'mine': 1})
    """
    def decorate(method: F) -> F:
        @functools.wraps(method)
        def callback(self: Any, *args: Any, **kwargs: Any) -> None:
            try:
                method(self, *args, **kwargs)
            except Exception as exc:
                self.rec.error(component, exc)

        return callback  # type: ignore[return-value]

    return decorate


def instrument(target: object, spec: AdapterSpec, make: Callable[[bool], InstT]) -> InstT:
    """Check ``target`` against ``spec``, build ``make(active)`` and install every hook.

    Returns the instrumentation: active with every hook installed, or inactive with
    nothing installed (an engine version whose methods or state differ; one warning).

    Raises:
        AdapterError: ``target`` is not one of ``spec.kinds``, cannot hold instance
            attributes, or is already instrumented.
    """
    inst = begin(target, spec.kinds, spec.hooks, spec.component, make, spec.state)
    if inst.active:
        for hook in spec.hooks:
            original = getattr(target, hook.method, None)
            if original is None:  # an optional method this engine lacks
                continue
            inst.install(hook.method, _wrapper(inst, hook, original))
    return inst


def _wrapper(inst: Instrumentation, hook: Hook, original: Callable[..., Any]) -> Callable[..., Any]:
    wrapper: Callable[..., Any]
    if hook.count is not None:
        wrapper = _count_wrapper(inst, hook, original)
    elif inspect.iscoroutinefunction(original):
        wrapper = _async_wrapper(inst, hook, original)
    else:
        wrapper = _call_wrapper(inst, hook, original)
    named = ("__name__", "__qualname__", "__doc__")
    functools.update_wrapper(wrapper, original, assigned=named, updated=())
    twin: Callable[..., Any] | None = _native_wrapper(inst, hook, original, wrapper)
    if twin is None:
        return wrapper
    functools.update_wrapper(twin, original, assigned=named, updated=())
    return twin


_HookCall: Any = getattr(native, "HookCall", None)
_AttrPath: Any = getattr(native, "AttrPath", None)


def attr_path(path: str) -> Callable[..., Any]:
    """A reader returning its first argument's dotted attribute ``path``, whatever else it
    is given: ``before=attr_path("target._num_write_pending_chunks")`` reads the engine's
    own count before each call. In C where the extension is built (no Python frame per
    call: :class:`kvobs.kernels._native.AttrPath`), else in Python.

    Raises:
        ValueError: ``path`` is not a dotted path of attribute names.

    Example:
        >>> from types import SimpleNamespace
        >>> read = attr_path("target.pending")
        >>> read(SimpleNamespace(target=SimpleNamespace(pending=3)), ["key"], None)
        3
    """
    if _AttrPath is not None:  # it checks the path itself
        return cast(Callable[..., Any], _AttrPath(path))
    if not all(name.isidentifier() for name in path.split(".")):
        raise ValueError(f"AttrPath: {path!r} is not a dotted path of attribute names")
    getter = operator.attrgetter(path)

    def read(obj: Any, *args: Any, **kwargs: Any) -> Any:
        return getter(obj)

    return read


def _native_wrapper(inst: Instrumentation, hook: Hook, original: Callable[..., Any],
                    fallback: Callable[..., Any]) -> Any:
    """The C twin of ``fallback`` (:class:`kvobs.kernels._native.HookCall`, no Python frame
    of its own), or None where the extension is not built or ``hook`` needs Python: a
    ``when`` gate of no plain form (:func:`_plain_gate`), a coroutine, parameters that are
    not plain. Calls it cannot bind (too many arguments, an unknown or repeated keyword, a
    required one missing) go to ``fallback``, which means the same."""
    if _HookCall is None or inspect.iscoroutinefunction(original):
        return None
    params = _plain_params(original)
    if params is None or len(params) > native.HOOK_MAX_PARAMS:
        return None
    names = tuple(p.name for p in params)
    if not all(name in names for name in (*hook.reiterable, *filter(None, [hook.count]))):
        return None
    gate: tuple[int, str | None, bool] = (-1, None, False)
    if hook.when is not None:
        plain = _plain_gate(hook.when, names)
        if plain is None:
            return None
        gate = plain
    defaults = tuple(p.default for p in params if p.default is not p.empty) or None
    count = getattr(inst.tier, hook.means) if hook.count is not None else None
    return _HookCall(original, names, defaults, inst, inst.error, inst.component, fallback,
                     before=hook.before, after=hook.after, count=count,
                     count_at=names.index(hook.count) if hook.count is not None else -1,
                     reiterable=tuple(names.index(name) for name in hook.reiterable),
                     gate_at=gate[0], gate_attr=gate[1], gate_next=gate[2])


_INST_ATTRIBUTE = re.compile(r"inst\.([A-Za-z_]\w*)")
_NEXT_OF_INST_ATTRIBUTE = re.compile(r"next\(\s*inst\.([A-Za-z_]\w*)\s*\)")


def _plain_gate(when: str, names: tuple[str, ...]) -> tuple[int, str | None, bool] | None:
    """``when`` as the C wrapper's gate, ``(gate_at, gate_attr, gate_next)``: the index of
    a parameter, or an attribute of inst (and whether its next item is the gate); None for
    any other expression (the Python wrapper evaluates it).

    Example:
        >>> _plain_gate("n", ("blocks", "n")), _plain_gate("inst.due", ("n",))
        ((1, None, False), (-1, 'due', False))
        >>> _plain_gate("next(inst.ticks)", ()), _plain_gate("n and inst.due", ("n",))
        ((-1, 'ticks', True), None)
    """
    text = when.strip()
    if text in names:
        return names.index(text), None, False
    attribute = _INST_ATTRIBUTE.fullmatch(text)
    following = None if attribute else _NEXT_OF_INST_ATTRIBUTE.fullmatch(text)
    found = attribute or following
    # Python reads the name as compiled (NFKC), and a parameter named next shadows the
    # builtin: those gates stay with the Python wrapper
    if found is None or unicodedata.normalize("NFKC", found[1]) != found[1] \
            or (following is not None and "next" in names):
        return None
    return -1, sys.intern(found[1]), following is not None


def _exact_params(original: Callable[..., Any], params: tuple[str, ...]) -> bool:
    """Whether ``original`` takes exactly ``params``, positional-or-keyword, no defaults,
    none named as the generated code names its own variables."""
    try:
        signature = inspect.signature(original)
    except (TypeError, ValueError):
        return False
    return tuple(signature.parameters) == params and all(
        p.kind is p.POSITIONAL_OR_KEYWORD and p.default is p.empty
        and p.name not in _GENERATED_NAMES for p in signature.parameters.values())


def _native_event(event: Any) -> bool:
    """Whether a tier's bound event method is C (a builtin method, not a Python one)."""
    return isinstance(event, types.BuiltinMethodType)


def _count_wrapper(inst: Instrumentation, hook: Hook, original: Callable[..., Any]) -> Any:
    """``original`` then ``tier.<field> += <count argument>``, guarded.

    With the engine's exact signature the wrapper is generated (as dataclasses does),
    so a hot allocator call pays one extra call and one add; otherwise it takes
    ``*args, **kwargs`` and reads the argument by position or name.
    """
    field = COUNT_FIELDS[hook.means]
    tier, error, component = inst.tier, inst.error, inst.component
    event = getattr(tier, hook.means)
    if _exact_params(original, hook.params):
        params = ", ".join(hook.params)
        # A tier whose event methods are C (kvobs.recorder.TierCore) is counted by calling
        # the method (~30 ns; its counters read and written as attributes cost ~60); a
        # Python one by the add itself (~25 ns, against ~55 for the method).
        add = f"event({hook.count})" if _native_event(event) else \
            f"tier.{field} += {hook.count}"
        source = (f"def {hook.method}({params}):\n"
                  f"    result = original({params})\n"
                  f"    try:\n"
                  f"        {add}\n"
                  f"    except Exception as exc:\n"
                  f"        error(component, exc)\n"
                  f"    return result\n")
        namespace: dict[str, Any] = {"original": original, "tier": tier, "event": event,
                                     "error": error, "component": component}
        return _define(source, namespace, hook.method, component)
    name: str = hook.count or ""
    index = hook.params.index(name)

    def counting(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        try:
            event(args[index] if len(args) > index else kwargs[name])
        except Exception as exc:
            error(component, exc)
        return result

    return counting


def _reiterable(hook: Hook) -> Callable[[tuple[Any, ...], dict[str, Any]], tuple[Any, ...]]:
    positions = [(hook.params.index(name), name) for name in hook.reiterable]

    def relist(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
        for index, name in positions:
            if len(args) > index:
                if not isinstance(args[index], (list, tuple)):
                    args = (*args[:index], list(args[index]), *args[index + 1:])
            elif name in kwargs and not isinstance(kwargs[name], (list, tuple)):
                kwargs[name] = list(kwargs[name])
        return args

    return relist


#: Names a generated wrapper uses itself (a parameter named so is not generated).
_GENERATED_NAMES = frozenset({"original", "before", "after", "inst", "error", "component",
                              "state", "result", "exc", "list", "isinstance", "tier",
                              "event"})


def _plain_params(original: Callable[..., Any]) -> list[inspect.Parameter] | None:
    """``original``'s parameters when all are positional-or-keyword (defaults allowed),
    else None (``*args``, ``**kwargs``, keyword-only or positional-only: not generated)."""
    try:
        params = list(inspect.signature(original).parameters.values())
    except (TypeError, ValueError):
        return None
    if not all(p.kind is p.POSITIONAL_OR_KEYWORD and p.name.isidentifier()
               and p.name not in _GENERATED_NAMES and not p.name.startswith("_") for p in params):
        return None
    return params


def _generated_call_wrapper(inst: Instrumentation, hook: Hook, original: Callable[..., Any],
                            params: list[inspect.Parameter]) -> Any:
    """A before/after wrapper with ``original``'s own signature (defaults bound through
    the namespace), so a call pays no ``*args`` packing: generated as dataclasses does,
    from the identifiers the signature check read."""
    namespace: dict[str, Any] = {"original": original, "before": hook.before,
                                 "after": hook.after, "inst": inst, "error": inst.error,
                                 "component": inst.component, "_seq": (list, tuple)}
    signature = []
    for i, param in enumerate(params):
        if param.default is param.empty:
            signature.append(param.name)
        else:
            namespace[f"_default{i}"] = param.default
            signature.append(f"{param.name}=_default{i}")
    args = ", ".join(p.name for p in params)
    call = f"({args})"
    lines = [f"def {hook.method}({', '.join(signature)}):"]
    if hook.when is not None:  # the gate, inline: a call with nothing to read pays no reader
        lines += ["    try:",
                  f"        if not ({hook.when}):",
                  f"            return original{call}",
                  "    except Exception as exc:",
                  "        error(component, exc)",
                  f"        return original{call}"]
    for name in hook.reiterable:  # readers iterate it as well as the engine
        lines.append(f"    if not isinstance({name}, _seq):\n        {name} = list({name})")
    state = "None"
    if hook.before is not None:
        lines += ["    try:",
                  f"        state = before(inst{', ' if args else ''}{args})",
                  "    except Exception as exc:",
                  "        error(component, exc)",
                  f"        return original{call}  # no state: nothing to read after"]
        state = "state"
    lines.append(f"    result = original{call}")
    if hook.after is not None:
        lines += ["    try:",
                  f"        after(inst, {state}, result{', ' if args else ''}{args})",
                  "    except Exception as exc:",
                  "        error(component, exc)"]
    lines.append("    return result")
    return _define("\n".join(lines) + "\n", namespace, hook.method, inst.component)


#: The file name generated wrappers carry (tracebacks, profilers and
#: ``benchmarks.vllm_scheduler_overhead --bytecodes`` tell them from an engine's own
#: generated code, such as its dataclasses' ``<string>``).
WRAPPER_FILE = "<kvobs wrapper {component}.{method}>"


def _define(source: str, namespace: dict[str, Any], method: str, component: str) -> Any:
    """The function ``method`` that ``source`` (built from identifiers a signature check
    read) defines, compiled under :data:`WRAPPER_FILE`."""
    code = compile(source, WRAPPER_FILE.format(component=component, method=method), "exec")
    exec(code, namespace)
    return namespace[method]


def _call_wrapper(inst: Instrumentation, hook: Hook, original: Callable[..., Any]) -> Any:
    params = _plain_params(original)
    if params is not None and all(name in {p.name for p in params}
                                  for name in hook.reiterable):
        return _generated_call_wrapper(inst, hook, original, params)
    before, after, error, component = hook.before, hook.after, inst.error, inst.component
    relist = _reiterable(hook) if hook.reiterable else None
    gate = _gate(inst, hook, original)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if gate is not None:
            try:
                if not gate(*args, **kwargs):
                    return original(*args, **kwargs)
            except Exception as exc:
                error(component, exc)
                return original(*args, **kwargs)
        if relist is not None:
            args = relist(args, kwargs)
        state = None
        if before is not None:
            try:
                state = before(inst, *args, **kwargs)
            except Exception as exc:
                error(component, exc)
                return original(*args, **kwargs)  # no state: nothing to read after
        result = original(*args, **kwargs)
        if after is not None:
            try:
                after(inst, state, result, *args, **kwargs)
            except Exception as exc:
                error(component, exc)
        return result

    return wrapper


def _gate(inst: Instrumentation, hook: Hook,
          original: Callable[..., Any]) -> Callable[..., Any] | None:
    """``hook.when`` as a function of a call's arguments, bound to ``original``'s own
    parameters with its defaults (the wrappers that take ``*args``), or None without one."""
    if hook.when is None:
        return None
    code = compile(hook.when, f"<when of {hook.method}>", "eval")
    try:
        signature: inspect.Signature | None = inspect.signature(original)
    except (TypeError, ValueError):
        signature = None
    scope = {"inst": inst}

    def gate(*args: Any, **kwargs: Any) -> Any:
        if signature is None:
            names = {**dict(zip(hook.params, args, strict=False)), **kwargs}
        else:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            names = bound.arguments
        return eval(code, scope, names)  # an adapter's own text, compiled once

    return gate


def _async_wrapper(inst: Instrumentation, hook: Hook, original: Callable[..., Any]) -> Any:
    before, after, error, component = hook.before, hook.after, inst.error, inst.component
    relist = _reiterable(hook) if hook.reiterable else None
    gate = _gate(inst, hook, original)

    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        if gate is not None:
            try:
                if not gate(*args, **kwargs):
                    return await original(*args, **kwargs)
            except Exception as exc:
                error(component, exc)
                return await original(*args, **kwargs)
        if relist is not None:
            args = relist(args, kwargs)
        state = None
        if before is not None:
            try:
                state = before(inst, *args, **kwargs)
            except Exception as exc:
                error(component, exc)
                return await original(*args, **kwargs)
        result = await original(*args, **kwargs)
        if after is not None:
            try:
                after(inst, state, result, *args, **kwargs)
            except Exception as exc:
                error(component, exc)
        return result

    return wrapper
