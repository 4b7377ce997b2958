"""The C extension, ``kvobs.kernels._native`` (built by ``pip install``; required).

One module, one C file per concern (``kernels/*.c``): the host block-copy loops
(``plan_pairs``, ``plan_seq``, ``copy_runs``, ``memcpy``, ``has_stream_copy``), the vLLM
block pool walk (``walk_slots``) and the cores of the reuse profile, the thrash tracker
and the residency sampler (``ReuseCore``, ``ThrashCore``, ``ResidencyCore``). Each is the
only implementation of what it does; its tests hold it to an oracle in ``tests/``.
"""

from __future__ import annotations

from kvobs.kernels import _native as native

__all__ = ["native"]
