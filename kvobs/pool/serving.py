"""A simulated serving loop: admits chat requests into the tiered pool on a virtual clock.

No model runs; a request occupies its blocks for a service time computed from its
uncached prompt tokens (prefill), its host-hit tokens (onload) and its output length
(decode). Decisions depend only on the virtual clock, so with the same seed every run
makes the same allocations, hits, offloads and evictions; block copies are real.

Example:
    >>> from kvobs.presets import preset_layout
    >>> from kvobs.recorder import Recorder
    >>> from kvobs.pool.workload import ChatWorkload
    >>> rec = Recorder()
    >>> pool = TieredKVPool(preset_layout("qwen2.5-0.5b"), 256, 1024, rec)
    >>> from kvobs.pool.tiered import TieredKVPool
    >>> loop = ServingLoop(pool, ChatWorkload(seed=1))
    >>> loop.run(duration_s=20.0, pace=False)
    >>> loop.stats.completed > 0 and rec.snapshot().lookups.gpu_hit > 0
    True
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from kvobs.errors import ConfigError
from kvobs.pool.tiered import Allocation, TieredKVPool
from kvobs.pool.workload import ChatWorkload, Request


@dataclass(frozen=True)
class ServingConfig:
    """Speeds of the simulated engine and the queue bound."""

    tick_s: float = 0.05
    prefill_tokens_per_s: float = 40_000.0
    onload_tokens_per_s: float = 400_000.0
    decode_s_per_token: float = 0.004
    max_waiting: int = 256

    def __post_init__(self) -> None:
        if not self.tick_s > 0:
            raise ConfigError(f"tick_s must be > 0, got {self.tick_s!r}")


@dataclass
class ServingStats:
    """What the loop did, for the live summary."""

    arrived: int = 0
    admitted: int = 0
    completed: int = 0
    rejected: int = 0
    running: int = 0
    waiting: int = 0


class ServingLoop:
    """Drives a :class:`TieredKVPool` with a :class:`ChatWorkload`."""

    def __init__(
        self, pool: TieredKVPool, workload: ChatWorkload, config: ServingConfig | None = None
    ) -> None:
        self.pool = pool
        self.workload = workload
        self.config = config or ServingConfig()
        self.stats = ServingStats()
        self.now_s = 0.0
        self._waiting: deque[Request] = deque()
        self._running: list[tuple[float, int, Request, Allocation]] = []
        self._order = itertools.count()
        self._capacity_tokens = pool.gpu.shape[0] * pool.block_tokens
        # Thrash windows and residency are measured on the virtual clock, paced or not.
        virtual_ns = lambda: int(self.now_s * 1e9)  # noqa: E731
        pool.recorder.thrash.clock_ns = virtual_ns
        for name in pool.recorder.tier_names:
            tracker = pool.recorder.tier(name).residency
            if tracker is not None:
                tracker.clock_ns = virtual_ns
        # The simulation knows its own prefill cost: host hits save exactly this.
        pool.recorder.prefill_cost.set(1 / self.config.prefill_tokens_per_s, "modelled")

    def step(self) -> None:
        """Advance the virtual clock by one tick: finish, arrive, admit."""
        self.now_s += self.config.tick_s
        while self._running and self._running[0][0] <= self.now_s:
            _, _, done, held = heapq.heappop(self._running)
            self.pool.release(held, (*done.segments, done.output_segment))
            self.workload.completed(done, self.now_s)
            self.stats.completed += 1
        for request in self.workload.arrivals_until(self.now_s):
            self.stats.arrived += 1
            too_big = request.prompt_tokens + request.output_tokens > self._capacity_tokens
            if too_big or len(self._waiting) >= self.config.max_waiting:
                self.stats.rejected += 1
                self.workload.completed(request, self.now_s)  # the user gives up this turn
            else:
                self._waiting.append(request)
        while self._waiting:
            request = self._waiting[0]
            allocation = self.pool.admit(request.segments, request.output_tokens)
            if allocation is None:
                break  # FIFO: wait until running requests free blocks
            self._waiting.popleft()
            self.stats.admitted += 1
            end = self.now_s + self._service_time(request, allocation)
            heapq.heappush(self._running, (end, next(self._order), request, allocation))
        self.pool.poll_transfers()
        self.stats.running, self.stats.waiting = len(self._running), len(self._waiting)

    def _service_time(self, request: Request, allocation: Allocation) -> float:
        cfg = self.config
        hit_tokens = (
            allocation.gpu_hit_blocks + allocation.host_hit_blocks
        ) * self.pool.block_tokens
        host_tokens = allocation.host_hit_blocks * self.pool.block_tokens
        prefill = max(request.prompt_tokens - hit_tokens, 1) / cfg.prefill_tokens_per_s
        return (
            prefill
            + host_tokens / cfg.onload_tokens_per_s
            + request.output_tokens * cfg.decode_s_per_token
        )

    def run(
        self,
        duration_s: float | None,
        pace: bool = True,
        on_tick: Callable[[], None] | None = None,
        should_stop: Callable[[], bool] | None = None,
    ) -> None:
        """Run ``duration_s`` more virtual seconds (None: until ``should_stop``).

        With ``pace`` the virtual clock follows the wall clock (the demo); without it
        the loop runs as fast as it can (warm-up, tests, benchmarks).
        """
        start_wall, start_virtual = time.monotonic(), self.now_s
        end = None if duration_s is None else start_virtual + duration_s
        while end is None or self.now_s < end:
            if should_stop is not None and should_stop():
                return
            self.step()
            if on_tick is not None:
                on_tick()
            if pace:
                lag = (self.now_s - start_virtual) - (time.monotonic() - start_wall)
                if lag > 0:
                    time.sleep(lag)
