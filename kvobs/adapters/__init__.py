"""Engine adapters: wrap an engine's own allocator objects and count into a Recorder.

Adapters wrap methods of one *instance* (never the class), check the engine version
first (an unknown one logs a warning and is left alone), never let a kvobs failure reach
the engine, and ``unwrap()`` restores the object. Shipped: ``kvobs.adapters.vllm``
(vLLM 0.33), ``kvobs.adapters.lmcache`` (LMCache 0.5.6); anything else:
``kvobs.adapters.generic``.
"""

from kvobs.adapters._hooks import AdapterError, Instrumentation
from kvobs.adapters.generic import KVCacheCallbacks, instrument_methods

__all__ = ["AdapterError", "Instrumentation", "KVCacheCallbacks", "instrument_methods"]
