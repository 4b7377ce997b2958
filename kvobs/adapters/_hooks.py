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
:class:`~kvobs.events.TierEvents` / :class:`~kvobs.events.LinkEvents` methods. Every hook
gets the same wrapper, a closure whose readers are chosen once, when it is installed
(structlog's way: decide at configuration, not per call): an optional ``when`` gate, the
arguments listed for re-reading, ``before``, the engine call, ``after``. A gate is a
reader too (``when(inst, *args, **kwargs)``), so a hook called every step with nothing to
read on most (``when=attr_path("in_flight")``) pays one call and no more.

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
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from kvobs.errors import KvobsError
from kvobs.events import EVENTS, NULL_TIER, TierEvents
from kvobs.logs import get_logger
from kvobs.ratelimit import RateLimit

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
        when: ``when(inst, *args, **kwargs) -> bool``, read before each call: when
            false, the engine method runs with no other reader. For hooks called every
            step with nothing to read on most (``attr_path("in_flight")``); a gate that
            raises counts as an error and reads nothing.
    """

    method: str
    params: tuple[str, ...]
    means: str = ""
    count: str | None = None
    before: Before | None = None
    after: After | None = None
    reiterable: tuple[str, ...] = ()
    optional: bool = False
    when: Callable[..., Any] | None = None

    def __post_init__(self) -> None:
        words = [w.strip() for w in self.means.split(",") if w.strip()]
        unknown = [w for w in words if w not in HOOK_MEANINGS]
        if unknown:
            raise ValueError(f"Hook {self.method}: means {unknown} are not in the vocabulary "
                             f"{HOOK_MEANINGS}")
        if self.when is not None and not callable(self.when):
            raise TypeError(f"Hook {self.method}: when={self.when!r} is not callable; give "
                            "a reader when(inst, *args, **kwargs), e.g. attr_path(...)")
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

    ``active`` is False when the object's version is unknown and nothing was installed;
    ``problems`` then says why, in words. ``retired`` names the hooks whose readers failed
    and that were taken off (:meth:`retire`).
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
        self.problems: list[str] = []
        self.retired: list[str] = []
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

    def retire(self, name: str, exc: BaseException) -> None:
        """Put the engine's own method ``name`` back after its readers failed: one
        warning says which, and the engine runs on with that hook reading nothing (its
        series stop where they were; the error counter says why)."""
        shadowed = self._shadowed.pop(name, None)
        if shadowed is None:  # another thread retired it first, or it was unwrapped
            return
        self._restore(name, *shadowed)
        self.retired.append(name)
        warn_once(f"{self.component}.{name}@{id(self)}", "kvobs_hook_disabled",
                  component=self.component,
                  method=name, error=f"{type(exc).__name__}: {exc}",
                  action="the engine method runs unwrapped from now on")

    def _restore(self, name: str, had_own: bool, value: Any) -> None:
        if had_own:
            setattr(self.target, name, value)
        elif _own_attribute(self.target, name)[0]:
            delattr(self.target, name)

    def unwrap(self) -> None:
        """Restore every shadowed method; a second call does nothing."""
        target = self.target
        for name, (had_own, value) in reversed(list(self._shadowed.items())):
            self._restore(name, had_own, value)
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
    inst.problems = problems
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
    """The one wrapper of ``original``, its readers chosen once, here: the gate, the
    arguments listed for re-reading, ``before`` and ``after`` (``count=`` is an ``after``
    adding one argument). One body for sync and async methods: :func:`_readers` does the
    reading around the engine call, each shell only calls or awaits the engine."""
    enter, leave = _readers(inst, hook)
    wrapper: Callable[..., Any]
    if inspect.iscoroutinefunction(original):
        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            state = None
            if enter is not None:
                args, state = enter(args, kwargs)
            result = await original(*args, **kwargs)
            if leave is not None:
                leave(state, result, args, kwargs)
            return result
    else:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            state = None
            if enter is not None:
                args, state = enter(args, kwargs)
            result = original(*args, **kwargs)
            if leave is not None:
                leave(state, result, args, kwargs)
            return result
    functools.update_wrapper(wrapper, original, assigned=("__name__", "__qualname__",
                                                          "__doc__"), updated=())
    return wrapper


#: ``enter``'s state when there is nothing to read after the call (a gate that did not
#: hold, a ``before`` that failed).
_SKIP: Any = object()

Enter = Callable[[tuple[Any, ...], dict[str, Any]], tuple[tuple[Any, ...], Any]]
Leave = Callable[[Any, Any, tuple[Any, ...], dict[str, Any]], None]


def _readers(inst: Instrumentation, hook: Hook) -> tuple[Enter | None, Leave | None]:
    """``enter(args, kwargs) -> (args, state)`` before the engine call and
    ``leave(state, result, args, kwargs)`` after it returned, each None where the hook
    reads nothing there (a call then costs the wrapper alone). A reader that raises an
    ``Exception`` is counted under the component and the engine call goes on, as made;
    nothing is read after a gate that did not hold or a ``before`` that failed. After its
    first failure the hook retires (:meth:`Instrumentation.retire`): a reader that failed
    once on an engine's objects would fail on every call, and an engine step must not
    pay for that."""
    when, before, after = hook.when, hook.before, hook.after
    error, component = inst.error, inst.component
    relist = _reiterable(hook) if hook.reiterable else None
    live = True

    def fail(exc: Exception) -> None:
        nonlocal live
        error(component, exc)
        if live:
            live = False
            inst.retire(hook.method, exc)

    def enter(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], Any]:
        if not live:  # a caller that kept the wrapper itself
            return args, _SKIP
        if when is not None:
            try:
                if not when(inst, *args, **kwargs):
                    return args, _SKIP
            except Exception as exc:
                fail(exc)
                return args, _SKIP
        if relist is not None:  # readers iterate it as well as the engine
            args = relist(args, kwargs)
        if before is None:
            return args, None
        try:
            return args, before(inst, *args, **kwargs)
        except Exception as exc:
            fail(exc)
            return args, _SKIP

    def leave(state: Any, result: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if state is not _SKIP and live:
            try:
                after(inst, state, result, *args, **kwargs)  # type: ignore[misc]  # not None
            except Exception as exc:
                fail(exc)

    def add(state: Any, result: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """``count=``: the named argument added to the tier's event."""
        if live:
            try:
                event(args[index] if len(args) > index else kwargs[name])
            except Exception as exc:
                fail(exc)

    if hook.count is not None:
        event, name = getattr(inst.tier, hook.means), hook.count
        index = hook.params.index(name)
        return None, add
    reads_before = when is not None or relist is not None or before is not None
    return (enter if reads_before else None), (leave if after is not None else None)


def attr_path(path: str) -> Callable[..., Any]:
    """A reader returning its first argument's dotted attribute ``path``, whatever else it
    is given: ``before=attr_path("target.num_pending")`` reads the engine's own count
    before each call, ``when=attr_path("in_flight")`` gates a hook on the
    instrumentation's own state.

    Raises:
        ValueError: ``path`` is not a dotted path of attribute names.

    Example:
        >>> from types import SimpleNamespace
        >>> read = attr_path("target.pending")
        >>> read(SimpleNamespace(target=SimpleNamespace(pending=3)), ["key"], None)
        3
    """
    if not path or not all(name.isidentifier() for name in path.split(".")):
        raise ValueError(f"attr_path: {path!r} is not a dotted path of attribute names")
    getter = operator.attrgetter(path)

    def read(obj: Any, *args: Any, **kwargs: Any) -> Any:
        return getter(obj)

    return read


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
