"""An exact LRU cache simulator and reference streams, the oracle for the reuse profile."""

from __future__ import annotations

import itertools
import random
from collections import OrderedDict
from collections.abc import Iterator, Sequence


def exact_lru_hit_ratio(references: Sequence[object], size: int) -> float:
    """Hit ratio of an LRU cache of ``size`` blocks over ``references`` (cold = miss)."""
    cache: OrderedDict[object, None] = OrderedDict()
    hits = 0
    for key in references:
        if key in cache:
            hits += 1
            cache.move_to_end(key)
        else:
            cache[key] = None
            if len(cache) > size:
                cache.popitem(last=False)
    return hits / len(references)


def zipf(n: int, keys: int, alpha: float, seed: int) -> list[int]:
    """Independent references to ``keys`` keys with Zipf(alpha) popularity."""
    rng = random.Random(seed)
    weights = [1 / (rank + 1) ** alpha for rank in range(keys)]
    return rng.choices(range(keys), weights=weights, k=n)


def loop(n: int, keys: int) -> list[int]:
    """A cyclic scan over ``keys`` keys: LRU smaller than the loop never hits."""
    return [i % keys for i in range(n)]


def scan_with_hot_set(n: int, hot: int, seed: int) -> list[int]:
    """Half the references to a small hot set, half a one-pass scan of fresh keys."""
    rng = random.Random(seed)
    fresh = iter(range(10**9, 10**9 + n))
    return [rng.randrange(hot) if rng.random() < 0.5 else next(fresh) for _ in range(n)]


def loop_with_hot_set(n: int, loop_keys: int, hot: int, seed: int) -> list[int]:
    """A cyclic scan over ``loop_keys`` keys, each followed half the time by one of a
    ``hot`` hot set: ``loop_keys + hot`` distinct blocks lie between a loop key's uses."""
    rng = random.Random(seed)
    out: list[int] = []
    for i in itertools.count():
        if len(out) >= n:
            return out[:n]
        out.append(10**9 + i % loop_keys)
        if rng.random() < 0.5:
            out.append(rng.randrange(hot))
    raise AssertionError("unreachable")


def chat_prefixes(requests: int, seed: int) -> Iterator[list[int]]:
    """Prefix-structured requests: shared system prompts, conversations that return."""
    rng = random.Random(seed)
    fresh = itertools.count(1 << 32)  # block ids; prefix-unique by construction
    systems = [[next(fresh) for _ in range(rng.randrange(4, 20))] for _ in range(40)]
    conversations: list[list[int]] = []
    for _ in range(requests):
        if conversations and rng.random() < 0.6:
            convo = rng.choice(conversations)
            convo.extend(next(fresh) for _ in range(rng.randrange(2, 8)))
        else:
            system = systems[min(int(rng.paretovariate(1.2)) - 1, len(systems) - 1)]
            convo = [*system, *(next(fresh) for _ in range(4))]
            conversations.append(convo)
            if len(conversations) > 400:
                conversations.pop(0)
        yield list(convo)


#: An event of a cache trace: (block key, counted). Counted events are prefix lookups;
#: the others are blocks the cache gained without a lookup (written during decode).
Event = tuple[object, bool]


def exact_lru_event_hit_ratio(events: Sequence[Event], size: int) -> float:
    """Hit ratio of the counted events of an LRU cache of ``size`` blocks: every event
    makes its block the most recent; only counted ones are hits or misses."""
    cache: OrderedDict[object, None] = OrderedDict()
    hits = counted = 0
    for key, is_lookup in events:
        if key in cache:
            hits += is_lookup
            cache.move_to_end(key)
        else:
            cache[key] = None
            if len(cache) > size:
                cache.popitem(last=False)
        counted += is_lookup
    return hits / counted


def exact_reuse_distances(events: Sequence[Event]) -> tuple[list[int], int]:
    """``(sorted LRU reuse distances of the counted events that were not cold, counted
    events)`` in one pass (a Fenwick tree over event times marks each block's latest
    use): an LRU cache of ``size`` blocks hits exactly the distances ``<= size``, so this
    answers every size at once, as :func:`exact_lru_event_hit_ratio` does one size."""
    found = reuse_distances_in_order(events)
    return sorted(d for d in found if d is not None), len(found)


def reuse_distances_in_order(events: Sequence[Event]) -> list[int | None]:
    """The LRU reuse distance of each counted event, in order (None: cold)."""
    size = len(events) + 1
    tree = [0] * (size + 1)
    last: dict[object, int] = {}
    distances: list[int | None] = []
    for now, (key, is_lookup) in enumerate(events, 1):
        previous = last.get(key)
        if previous is not None:
            if is_lookup:  # distinct blocks used after `previous`, + the block itself
                i, later = now - 1, 0
                while i > 0:
                    later += tree[i]
                    i -= i & -i
                i = previous
                while i > 0:
                    later -= tree[i]
                    i -= i & -i
                distances.append(later + 1)
            i = previous
            while i <= size:
                tree[i] -= 1
                i += i & -i
        elif is_lookup:
            distances.append(None)
        last[key] = now
        i = now
        while i <= size:
            tree[i] += 1
            i += i & -i
    return distances


def chat_with_answers(requests: int, seed: int, systems: int = 60,
                      hot_system_blocks: int = 0,
                      live_conversations: int = 600) -> Iterator[tuple[list[int], list[int]]]:
    """Multi-turn chat: ``(prompt blocks looked up, answer blocks written in decode)`` per
    request. A returning conversation's prompt is its history: every earlier prompt and
    answer, then the new user turn, so its last answer is hit only if written blocks are
    seen. System prompts have Zipf popularity; ``hot_system_blocks`` > 0 makes one tiny
    system prompt of that many blocks that half the conversations share; at most
    ``live_conversations`` come back (a random one leaves when another starts)."""
    rng = random.Random(seed)
    fresh = itertools.count(1 << 40)
    prompts = [[next(fresh) for _ in range(rng.randrange(4, 24))] for _ in range(systems)]
    hot = [next(fresh) for _ in range(hot_system_blocks)]
    live: list[list[int]] = []
    for _ in range(requests):
        if live and rng.random() < 0.65:
            convo = live[rng.randrange(len(live))]
            convo.extend(next(fresh) for _ in range(rng.randrange(1, 4)))  # the user's turn
        else:
            if hot and rng.random() < 0.5:
                system = hot
            else:
                system = prompts[min(int(rng.paretovariate(1.1)) - 1, len(prompts) - 1)]
            convo = [*system, *(next(fresh) for _ in range(rng.randrange(1, 6)))]
            live.append(convo)
            if len(live) > live_conversations:
                live.pop(rng.randrange(len(live)))
        answer = [next(fresh) for _ in range(rng.randrange(1, 12))]
        yield list(convo), answer
        convo.extend(answer)


def mixed_trace(references: int, seed: int) -> list[Event]:
    """A trace kvobs's own tests never tuned on: Zipf system prompts and returning chats
    with decode-written answers, one-pass scans (long documents read once), bursts of one
    hot prefix, and a hot set smaller than any bucket; ``references`` counted events."""
    rng = random.Random(seed)
    chats = chat_with_answers(10**9, seed + 1)
    fresh = itertools.count(1 << 50)
    hot = [next(fresh) for _ in range(6)]
    burst: list[int] = []
    events: list[Event] = []
    counted = 0
    while counted < references:
        roll = rng.random()
        if roll < 0.7:
            prompt, answer = next(chats)
        elif roll < 0.8:
            prompt, answer = [next(fresh) for _ in range(rng.randrange(20, 200))], []
        elif roll < 0.9:
            if not burst or rng.random() < 0.05:
                burst = [next(fresh) for _ in range(rng.randrange(8, 64))]
            prompt, answer = list(burst), []
        else:
            prompt, answer = list(hot), [next(fresh) for _ in range(2)]
        events.extend((key, True) for key in prompt)
        events.extend((key, False) for key in answer)
        counted += len(prompt)
    return events
