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
