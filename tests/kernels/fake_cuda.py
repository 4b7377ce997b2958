"""Small fakes of the CUDA stream and event objects a StreamMover drives (no GPU in CI).

Only the CUDA objects are faked: copies run for real on CPU tensors. Each fake stream
keeps a log of what was enqueued on it; the test plays the device by completing
recorded events with ``finish_next(at_seconds)``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

from kvobs.kernels.cuda_backend import as_words


class FakeEvent:
    def __init__(self, name: str) -> None:
        self.name = name
        self.stream: FakeStream | None = None
        self.done = False
        self.at = 0.0
        self.error: Exception | None = None
        self.fail_record: Exception | None = None
        self.host_syncs = 0

    def record(self, stream: FakeStream | None = None) -> None:
        assert stream is not None, "events must be recorded on an explicit stream"
        if self.fail_record is not None:
            raise self.fail_record
        self.stream, self.done = stream, False
        stream.log.append(f"record {self.name}")
        stream.queue.append(self)

    def query(self) -> bool:
        if self.error is not None:
            raise self.error
        return self.done

    def elapsed_time(self, end_event: FakeEvent) -> float:
        assert self.done and end_event.done, "elapsed_time needs both events complete"
        return (end_event.at - self.at) * 1e3

    def synchronize(self) -> None:
        self.host_syncs += 1
        assert self.stream is not None
        while not self.done:
            self.stream.finish_next(self.stream.clock + 0.001)


class FakeStream:
    def __init__(self, name: str) -> None:
        self.name = name
        self.log: list[str] = []
        self.queue: deque[FakeEvent] = deque()
        self.clock = 0.0
        self.fail_wait: Exception | None = None

    def wait_stream(self, stream: FakeStream) -> None:
        if self.fail_wait is not None:
            raise self.fail_wait
        self.log.append(f"wait_stream {stream.name}")

    def wait_event(self, event: FakeEvent) -> None:
        self.log.append(f"wait_event {event.name}")

    def finish_next(self, at: float) -> FakeEvent:
        """The device reached the oldest recorded event at ``at`` seconds."""
        event = self.queue.popleft()
        event.done, event.at, self.clock = True, at, at
        return event


class FakeBackend:
    """Implements kvobs.kernels.cuda_backend.Backend over CPU tensors and fake streams."""

    def __init__(self, direction: str = "h2d", *, mappable: bool = True) -> None:
        self.direction = direction
        self.mappable = mappable
        self.compute = FakeStream("compute")
        self.streams: dict[str, FakeStream] = {}
        self.active: FakeStream | None = None
        self.events: list[FakeEvent] = []
        self.allocations = 0
        self.host_buffers: list[torch.Tensor] = []
        self.checked_host_layers: list[str] = []
        self.inside_use: Callable[[], None] | None = None  # runs while a copy is enqueued

    def stream(self, direction: str) -> FakeStream:
        return self.streams.setdefault(direction, FakeStream(direction))

    def current_stream(self) -> FakeStream:
        return self.active or self.compute

    @contextmanager
    def use(self, stream: FakeStream) -> Iterator[None]:
        stream.log.append("enter")
        self.active = stream
        try:
            if self.inside_use is not None:
                self.inside_use()
            yield
        finally:
            self.active = None
            stream.log.append("exit")

    def event(self) -> FakeEvent:
        self.events.append(FakeEvent(f"e{len(self.events)}"))
        return self.events[-1]

    def empty_host(self, numel: int) -> torch.Tensor:
        self.allocations += 1
        self.host_buffers.append(torch.empty(numel, dtype=torch.int64))
        return self.host_buffers[-1]

    def empty_device(self, numel: int, dtype: torch.dtype) -> torch.Tensor:
        self.allocations += 1
        return torch.empty(numel, dtype=dtype)

    def word_view(self, layer: torch.Tensor) -> torch.Tensor | None:
        found = as_words(layer) if self.mappable else None
        return None if found is None else found[0]

    def check_host_layer(self, layer: torch.Tensor, where: str) -> None:
        self.checked_host_layers.append(where)
