"""Engine adapters: wrap an engine's own allocator objects and count into a Recorder.

Adapters wrap methods of one *instance* (never the class), check the engine version
first (an unknown one logs a warning and is left alone), never let a kvobs failure reach
the engine, and ``unwrap()`` restores the object. Shipped: ``kvobs.adapters.vllm``
(vLLM), ``kvobs.adapters.sglang`` (SGLang), ``kvobs.adapters.lmcache`` (LMCache), each
tested on the releases :mod:`kvobs.adapters.versions` lists; anything else:
``kvobs.adapters.generic``. Every one is built from the adapter-author API,
:mod:`kvobs.adapters.api`, and takes the machinery from there only
(``kvobs.adapters._hooks`` is private).
"""

from kvobs.adapters.api import AdapterError, Instrumentation
from kvobs.adapters.generic import KVCacheCallbacks, instrument_methods

__all__ = ["AdapterError", "Instrumentation", "KVCacheCallbacks", "instrument_methods"]
