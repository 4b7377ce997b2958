"""A realistic, deterministic multi-turn chat workload for the reference pool.

Conversations start as a Poisson process. Each picks a system prompt by Zipf
popularity (a few assistants serve most traffic, so their prefixes stay hot on the
GPU), then sends turns: every turn's prompt is the system prompt, the whole history so
far and a new user message. After a turn completes the user thinks (exponential think
time) and returns with probability ``continue_p``, so prefixes come back seconds later,
often after the GPU tier has pushed them out to the host tier.

Everything derives from ``seed`` and the virtual clock, so a run is reproducible.

Example:
    >>> wl = ChatWorkload(WorkloadConfig(rate=4.0), seed=7)
    >>> first = wl.arrivals_until(5.0)
    >>> len(first) > 0 and first[0].prompt_tokens > first[0].new_tokens
    True
"""

from __future__ import annotations

import heapq
import itertools
import random
from dataclasses import dataclass, field

from kvobs.errors import ConfigError

Segment = tuple[str, int, int]  # (kind, id, tokens): "sys" prompt id, or "turn" unique id


@dataclass(frozen=True)
class WorkloadConfig:
    """Knobs of the chat workload; defaults resemble a busy chat assistant."""

    rate: float = 3.0  # new conversations per second
    system_prompts: int = 24
    zipf_s: float = 1.2
    system_tokens: tuple[int, int] = (256, 2048)
    user_tokens: tuple[int, int] = (32, 400)
    output_tokens: tuple[int, int] = (64, 512)
    think_time_mean_s: float = 6.0
    continue_p: float = 0.75
    max_turns: int = 10

    def __post_init__(self) -> None:
        if not self.rate > 0:
            raise ConfigError(
                f"rate must be > 0 conversations per second, got {self.rate!r}: pass --rate R"
            )
        if not 0 <= self.continue_p < 1:
            raise ConfigError(f"continue_p must be in [0, 1), got {self.continue_p!r}")
        if self.system_prompts <= 0 or self.max_turns <= 0:
            raise ConfigError("system_prompts and max_turns must be positive")


@dataclass
class Request:
    """One turn of one conversation, as the serving loop sees it."""

    conversation: int
    turn: int
    arrival_s: float
    segments: tuple[Segment, ...]
    new_tokens: int
    output_tokens: int
    output_segment: Segment = field(default=("turn", -1, 0))

    @property
    def prompt_tokens(self) -> int:
        """Tokens of the whole prompt (system + history + new message)."""
        return sum(seg[2] for seg in self.segments)


@dataclass
class _Conversation:
    id: int
    history: list[Segment]
    turn: int = 0


class ChatWorkload:
    """Generates :class:`Request` s on a virtual clock; told when each turn completes."""

    def __init__(self, config: WorkloadConfig | None = None, seed: int = 0) -> None:
        self.config = config or WorkloadConfig()
        self._rng = random.Random(seed)
        cfg = self.config
        self._system_sizes = [
            self._rng.randint(*cfg.system_tokens) for _ in range(cfg.system_prompts)
        ]
        weights = [1.0 / (rank**cfg.zipf_s) for rank in range(1, cfg.system_prompts + 1)]
        self._cumulative = list(itertools.accumulate(weights))
        self._segment_ids = itertools.count()
        self._conversation_ids = itertools.count()
        self._conversations: dict[int, _Conversation] = {}
        self._next_new = self._rng.expovariate(cfg.rate)
        self._returns: list[tuple[float, int]] = []  # heap of (arrival time, conversation)

    def arrivals_until(self, now_s: float) -> list[Request]:
        """Requests arriving up to virtual time ``now_s``, in arrival order."""
        out: list[Request] = []
        while self._next_new <= now_s:
            out.append(self._start_conversation(self._next_new))
            self._next_new += self._rng.expovariate(self.config.rate)
        while self._returns and self._returns[0][0] <= now_s:
            at, conv_id = heapq.heappop(self._returns)
            out.append(self._next_turn(self._conversations[conv_id], at))
        out.sort(key=lambda r: r.arrival_s)
        return out

    def completed(self, request: Request, now_s: float) -> None:
        """The turn finished at ``now_s``: its answer joins the history; maybe come back."""
        conv = self._conversations.get(request.conversation)
        if conv is None:
            return
        conv.history.append(request.output_segment)
        cfg = self.config
        if conv.turn < cfg.max_turns and self._rng.random() < cfg.continue_p:
            think = self._rng.expovariate(1.0 / cfg.think_time_mean_s)
            heapq.heappush(self._returns, (now_s + think, conv.id))
        else:
            del self._conversations[conv.id]

    @property
    def active_conversations(self) -> int:
        """Conversations still expected to come back."""
        return len(self._conversations)

    def _start_conversation(self, at: float) -> Request:
        prompt = self._rng.choices(range(self.config.system_prompts), cum_weights=self._cumulative)[
            0
        ]
        conv = _Conversation(
            next(self._conversation_ids), [("sys", prompt, self._system_sizes[prompt])]
        )
        self._conversations[conv.id] = conv
        return self._next_turn(conv, at)

    def _next_turn(self, conv: _Conversation, at: float) -> Request:
        cfg = self.config
        conv.turn += 1
        user = ("turn", next(self._segment_ids), self._rng.randint(*cfg.user_tokens))
        conv.history.append(user)
        output = self._rng.randint(*cfg.output_tokens)
        return Request(
            conv.id,
            conv.turn,
            at,
            tuple(conv.history),
            user[2],
            output,
            ("turn", next(self._segment_ids), output),
        )
