"""The adapter-author API: declare an engine's hooks as a table, kvobs installs them.

This is the public home of what every shipped adapter is built from (the machinery lives
in a private module; these names are the contract). An adapter is an
:class:`AdapterSpec` naming the engine classes it supports and one :class:`Hook` per
engine method: which vocabulary event the call means (:mod:`kvobs.events`) and small
readers of its arguments and result. :func:`instrument` checks one engine *instance*
against the spec and wraps it; :class:`Instrumentation` is what it returns (``unwrap()``
restores the object exactly). :func:`guarded` turns a reader you call yourself into one
whose failure is counted instead of raised; :func:`warn_once` logs a warning once per
process; :class:`AdapterError` is an object that cannot be instrumented; :func:`attr_path` is a
``before`` that only reads an attribute, with no Python frame where the C extension is
built. For an engine method whose result must be wrapped rather than read (a generator
stepped layer by layer), :func:`begin` checks and marks the object as :func:`instrument`
does and leaves the installing to the adapter (:meth:`Instrumentation.install`);
:data:`MARKER` is the attribute holding an object's instrumentation, and
:func:`class_names` the class names an adapter matches without importing the engine.
Every shipped adapter imports from here only. Check an adapter with :mod:`kvobs.testing`.

Example:
    >>> from kvobs.adapters.api import AdapterSpec, Hook, Instrumentation, instrument
    >>> from kvobs.recorder import Recorder
    >>> class BlockPool:
    ...     def get_new_blocks(self, num_blocks): return [0] * num_blocks
    >>> SPEC = AdapterSpec("mine.block_pool", ("BlockPool",), (
    ...     Hook("get_new_blocks", ("num_blocks",), "allocate", count="num_blocks"),))
    >>> rec, pool = Recorder(), BlockPool()
    >>> inst = instrument(pool, SPEC, lambda active: Instrumentation(
    ...     pool, SPEC.component, active, rec, rec.add_tier("gpu", 8, 16, 1024)))
    >>> _ = pool.get_new_blocks(3)
    >>> rec.snapshot().tier("gpu").allocations
    3
    >>> inst.unwrap()
"""

from kvobs.adapters._hooks import (
    MARKER,
    AdapterError,
    AdapterSpec,
    Hook,
    Instrumentation,
    attr_path,
    begin,
    class_names,
    guarded,
    instrument,
    signature_problems,
    warn_once,
)
from kvobs.events import EVENTS, LinkEvents, TierEvents

__all__ = [
    "EVENTS",
    "MARKER",
    "AdapterError",
    "AdapterSpec",
    "Hook",
    "Instrumentation",
    "LinkEvents",
    "TierEvents",
    "attr_path",
    "begin",
    "class_names",
    "guarded",
    "instrument",
    "signature_problems",
    "warn_once",
]
