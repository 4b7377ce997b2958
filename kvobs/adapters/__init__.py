"""Engine adapters: wrap an engine's own allocator objects and count into a Recorder.

Adapters wrap methods of one *instance* (never the class), check the engine version
first, and never let a kvobs failure reach the engine. ``unwrap()`` restores the object.
"""

from kvobs.adapters._hooks import AdapterError, Instrumentation

__all__ = ["AdapterError", "Instrumentation"]
