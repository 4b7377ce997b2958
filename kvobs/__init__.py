"""kvobs: observability for tiered KV caches.

The front door for instrumenting an engine from Python:

* :class:`Recorder` counts what happens in every tier (plain integer adds);
* :class:`KVCacheCallbacks` is what an engine calls at its allocate / free / reuse /
  store / evict / transfer / drop / fail / lookup points, by tier name;
  :func:`instrument_methods` wraps methods of an allocator instance instead;
* :func:`start_telemetry` starts every sink in one call: Prometheus ``/metrics``
  and / or OTLP push, the capacity log and the periodic summary, as its arguments, the
  ``KVOBS_*`` / ``OTEL_*`` variables or the defaults say. It returns the
  :class:`Telemetry`; ``close()`` it at shutdown. kvobs logs through the standard
  ``logging`` module (logger ``kvobs``) unless told to print its own lines.

Example:
    >>> import urllib.request, kvobs
    >>> rec = kvobs.Recorder(engine="mine", model="llama-3-8b")
    >>> kv = kvobs.KVCacheCallbacks(rec, {"gpu": (1024, 16, 2 * 2**20)})
    >>> telemetry = kvobs.start_telemetry(rec, metrics_addr="127.0.0.1:0", summary_interval_s=0)
    >>> kv.allocate("gpu", 3)
    >>> page = urllib.request.urlopen(telemetry.metrics_url).read().decode()
    >>> 'kvobs_block_allocations_total{engine="mine",model="llama-3-8b",tier="gpu"} 3.0' in page
    True
    >>> telemetry.close()

Engine adapters (``kvobs.adapters.vllm``, ``.lmcache``, ``.sglang``), the conformance
kit (``kvobs.testing``) and the swap kernels (``kvobs.kernels``) are imported from
their own modules. Names here load on first use, so ``import kvobs`` stays cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from kvobs._version import __version__

if TYPE_CHECKING:
    from kvobs.adapters.generic import KVCacheCallbacks, instrument_methods
    from kvobs.capacity import CapacityPlan
    from kvobs.errors import ConfigError, KvobsError
    from kvobs.exporter import Telemetry, start_telemetry
    from kvobs.recorder import Recorder

_LAZY = {
    "CapacityPlan": "kvobs.capacity",
    "ConfigError": "kvobs.errors",
    "KVCacheCallbacks": "kvobs.adapters.generic",
    "KvobsError": "kvobs.errors",
    "Recorder": "kvobs.recorder",
    "Telemetry": "kvobs.exporter",
    "instrument_methods": "kvobs.adapters.generic",
    "start_telemetry": "kvobs.exporter",
}

__all__ = [
    "CapacityPlan",
    "ConfigError",
    "KVCacheCallbacks",
    "KvobsError",
    "Recorder",
    "Telemetry",
    "__version__",
    "instrument_methods",
    "start_telemetry",
]


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
