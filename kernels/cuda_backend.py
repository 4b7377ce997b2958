"""The CUDA pieces a ``StreamMover`` uses: streams, timing events, device views of host pools.

Kept behind a small Protocol so that the mover's bookkeeping (stream ordering, event
polling, slot reuse) is unit-tested on CPU with fake streams and events; ``CudaBackend``
is the real one.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any, ClassVar, Protocol

import torch

# DMA-friendly element types for a device view of host memory (widest that divides a block).
_WORDS = ((8, torch.int64, "<i8"), (4, torch.int32, "<i4"), (2, torch.int16, "<i2"))


class EventLike(Protocol):
    """The subset of ``torch.cuda.Event`` (created with ``enable_timing=True``) used."""

    def record(self, stream: Any = None) -> None: ...
    def query(self) -> bool: ...
    def elapsed_time(self, end_event: Any) -> float: ...
    def synchronize(self) -> None: ...


class StreamLike(Protocol):
    """The subset of ``torch.cuda.Stream`` used."""

    def wait_stream(self, stream: Any) -> None: ...
    def wait_event(self, event: Any) -> None: ...


class Backend(Protocol):
    """Where a StreamMover gets its streams and events, and how it reaches host memory.

    ``direction`` is ``"d2h"`` (swap out), ``"h2d"`` (swap in) or ``"d2d"``; buffers from
    ``empty_host`` are page-locked and those from ``empty_device`` live on the device.
    """

    direction: str

    def empty_host(self, numel: int) -> torch.Tensor: ...
    def empty_device(self, numel: int, dtype: torch.dtype) -> torch.Tensor: ...
    def stream(self, direction: str) -> StreamLike: ...
    def current_stream(self) -> StreamLike: ...
    def use(self, stream: StreamLike) -> AbstractContextManager[None]: ...
    def event(self) -> EventLike: ...
    def word_view(self, layer: torch.Tensor) -> torch.Tensor | None: ...
    def check_host_layer(self, layer: torch.Tensor, where: str) -> None: ...


def as_words(layer: torch.Tensor) -> tuple[torch.Tensor, int, str] | None:
    """``layer`` viewed as ``[num_blocks, words]`` of the widest integer type, or None.

    Example:
        >>> words, size, typestr = as_words(torch.zeros(4, 16, 8, dtype=torch.float16))
        >>> tuple(words.shape), size, typestr
        ((4, 32), 8, '<i8')
    """
    item = layer.element_size()
    elems = math.prod(layer.shape[1:])
    flat = layer.as_strided((layer.shape[0], elems), (layer.stride(0), 1))
    for size, dtype, typestr in _WORDS:
        if (elems * item) % size or (layer.stride(0) * item) % size or layer.data_ptr() % size:
            continue
        return flat.view(dtype), size, typestr
    return None


def aliases(view: torch.Tensor, words: torch.Tensor, device: torch.device) -> bool:
    """Whether ``view`` is ``words``'s own memory seen from ``device`` (not a copy).

    Example:
        >>> words = torch.zeros(4, 8, dtype=torch.int64)
        >>> aliases(words.view(4, 8), words, torch.device("cpu"))
        True
        >>> aliases(words.clone(), words, torch.device("cpu"))
        False
    """
    return (
        view.device == device
        and view.data_ptr() == words.data_ptr()
        and tuple(view.shape) == tuple(words.shape)
        and view.stride() == words.stride()
    )


class _HostArray:
    """Exposes a pinned host tensor through ``__cuda_array_interface__`` (UVA pointer)."""

    def __init__(self, words: torch.Tensor, size: int, typestr: str) -> None:
        self.__cuda_array_interface__ = {
            "shape": tuple(words.shape),
            "strides": tuple(s * size for s in words.stride()),
            "typestr": typestr,
            "data": (words.data_ptr(), False),
            "version": 3,
        }


class CudaBackend:
    """Real CUDA: one cached stream per direction on ``device``, timing events.

    Example:
        >>> backend = CudaBackend(torch.device("cuda", 0), "d2h")  # doctest: +SKIP
        >>> stream = backend.stream("d2h")                   # doctest: +SKIP
    """

    _streams: ClassVar[dict[tuple[int, str], Any]] = {}

    def __init__(self, device: torch.device, direction: str) -> None:
        self.device = device
        self.direction = direction

    @classmethod
    def for_pools(cls, src_device: torch.device, dst_device: torch.device) -> CudaBackend:
        """The backend for moving blocks from ``src_device`` to ``dst_device``.

        Raises:
            ValueError: when neither pool is on a GPU, or they sit on two different GPUs.
        """
        kinds = (src_device.type, dst_device.type)
        if kinds == ("cpu", "cpu"):
            raise ValueError("both pools are in host memory; use BlockMover for host <-> host")
        if kinds == ("cuda", "cuda"):
            if src_device != dst_device:
                raise ValueError(
                    f"src pool on {src_device} and dst pool on {dst_device}: peer copies are "
                    "not supported; keep both pools on one GPU"
                )
            return cls(src_device, "d2d")
        if kinds == ("cuda", "cpu"):
            return cls(src_device, "d2h")
        return cls(dst_device, "h2d")

    def empty_host(self, numel: int) -> torch.Tensor:
        """A pinned int64 host buffer (index upload staging)."""
        return torch.empty(numel, dtype=torch.int64, pin_memory=True)

    def empty_device(self, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """A device buffer (indices, gather staging)."""
        return torch.empty(numel, dtype=dtype, device=self.device)

    def stream(self, direction: str) -> Any:
        """The process-wide dedicated stream for ``direction`` on this device."""
        key = (self.device.index or 0, direction)
        if key not in self._streams:
            self._streams[key] = torch.cuda.Stream(self.device)  # type: ignore[no-untyped-call]
        return self._streams[key]

    def current_stream(self) -> Any:
        """The caller's current stream (where the engine's compute runs)."""
        return torch.cuda.current_stream(self.device)

    @contextmanager
    def use(self, stream: Any) -> Iterator[None]:
        """Make ``stream`` current for the copies issued inside."""
        with torch.cuda.stream(stream):
            yield

    def event(self) -> Any:
        """A timing event."""
        return torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]

    def word_view(self, layer: torch.Tensor) -> torch.Tensor | None:
        """A device-side ``[num_blocks, words]`` view of ``layer`` (host layers via UVA).

        None when no view *aliases* the host memory on this device: ``torch.as_tensor``
        copies where the pointer belongs to another device (or is not mapped), and a
        kernel writing into such a copy would lose every write without an error.
        """
        found = as_words(layer)
        if found is None:
            return None
        words, size, typestr = found
        if words.is_cuda:
            return words if words.device == self.device else None
        try:
            view = torch.as_tensor(_HostArray(words, size, typestr), device=self.device)
        except (RuntimeError, TypeError, ValueError):  # not mapped into the device space
            return None
        return view if aliases(view, words, self.device) else None

    def check_host_layer(self, layer: torch.Tensor, where: str) -> None:
        """Async copies need page-locked host memory; pageable memory would block the host."""
        if layer.shape[0] and not layer.is_pinned():
            raise ValueError(
                f"{where}: host memory is not pinned, so copies to or from the GPU would block; "
                "allocate it with torch.empty(..., pin_memory=True)"
            )
