"""How large a fleet one ``kvobs fleet`` aggregator follows: events a second, memory, and
the sampled index's accuracy against the unsampled one.

A synthetic fleet of ``--replicas`` replicas (default 1,000) serves a chat workload routed
at random (so replicas hold each other's prefixes): tenants' shared system prompts and
conversations that come back for more turns. Each replica keeps an LRU GPU pool of
``--gpu-blocks`` and an LRU host tier of ``--host-blocks``, offloads every block it
computes, and publishes one KV event batch a request as vLLM does (its GPU stores, GPU
removals, host stores, host removals), msgpack-encoded in vLLM's wire format. The
payloads are made first; then, for each sampling rate, a fresh index is fed every
payload in order through what the subscriber runs per batch (``decode_batch`` and the
index's updates; ZeroMQ's own transport is not in the loop), timed, then fed again under
``tracemalloc`` for its memory. Accuracy: each sampled index's estimates (duplicated
blocks, extra copies, resident blocks, computed tokens by cause) against the unsampled
index's exact counts: relative for blocks, and for each cause the difference of its share of
the computed tokens. The error of a sampled count shrinks with the square root of the
blocks followed: a fleet whose replicas hold 30,000 GPU blocks each, not 512, is followed
with 60 times as many at the same rate.

    python -m benchmarks.fleet_scale
    python -m benchmarks.fleet_scale --replicas 100 --requests 20000 --rates 1 1/16
"""

from __future__ import annotations

import argparse
import random
import time
import tracemalloc
from collections import OrderedDict
from fractions import Fraction

import msgspec

from kvobs.fleet.index import CAUSES, FleetIndex, Sampling
from kvobs.fleet.wire import decode_batch

BLOCK = 16


def make_stream(replicas: int, requests: int, gpu_blocks: int, host_blocks: int,
                seed: int = 0) -> tuple[list[tuple[int, bytes]], int]:
    """The fleet's payloads in publication order, ``(replica, payload)``, and the block
    events they carry."""
    rnd = random.Random(seed)
    tenants = [[rnd.getrandbits(64) for _ in range(rnd.randrange(2, 9))] for _ in range(400)]
    conversations: list[list[int]] = []
    gpu = [OrderedDict[int, None]() for _ in range(replicas)]
    host = [OrderedDict[int, None]() for _ in range(replicas)]
    encode = msgspec.msgpack.Encoder().encode
    stream, block_events = [], 0
    for _ in range(requests):
        if conversations and rnd.random() < 0.6:
            chat = conversations[rnd.randrange(len(conversations))]
        else:
            chat = list(rnd.choice(tenants))
            if len(conversations) < 20_000:
                conversations.append(chat)
            else:
                conversations[rnd.randrange(len(conversations))] = chat
        chat.extend(rnd.getrandbits(64) for _ in range(rnd.randrange(1, 6)))
        replica = rnd.randrange(replicas)
        mine_gpu, mine_host = gpu[replica], host[replica]
        stored, removed, offloaded, dropped = [], [], [], []
        for key in chat[-64:]:
            if key in mine_gpu:
                mine_gpu.move_to_end(key)
                continue
            mine_gpu[key] = None
            stored.append(key)
            if len(mine_gpu) > gpu_blocks:
                removed.append(mine_gpu.popitem(last=False)[0])
            if key in mine_host:
                mine_host.move_to_end(key)
            else:
                mine_host[key] = None
                offloaded.append(key)
                if len(mine_host) > host_blocks:
                    dropped.append(mine_host.popitem(last=False)[0])
        events = [
            {"type": "BlockStored", "block_hashes": stored, "parent_block_hash": None,
             "token_ids": [], "block_size": BLOCK, "lora_id": None, "medium": "GPU"},
            {"type": "BlockRemoved", "block_hashes": removed, "medium": "GPU"},
            {"type": "BlockStored", "block_hashes": offloaded, "parent_block_hash": None,
             "token_ids": [], "block_size": BLOCK, "lora_id": None, "medium": "CPU"},
            {"type": "BlockRemoved", "block_hashes": dropped, "medium": "CPU"},
        ]
        block_events += len(stored) + len(removed) + len(offloaded) + len(dropped)
        stream.append((replica, encode([time.time(), events, 0])))
    return stream, block_events


def feed(index: FleetIndex, stream: list[tuple[int, bytes]], replicas: int) -> None:
    """What the subscriber does with each payload (``Subscriber._apply``)."""
    for n in range(replicas):
        index.replica(f"r{n}")
    for replica, payload in stream:
        index.apply(replica, decode_batch(payload).events)


def figures(index: FleetIndex) -> dict[str, float]:
    """The estimates accuracy is judged on."""
    out: dict[str, float] = {}
    for tier in ("gpu", "host"):
        out[f"duplicated {tier}"], out[f"extra copies {tier}"] = index.duplicated(tier)
        out[f"resident {tier}"] = sum(r[tier] for r in index.resident) * index.scale
    for cause in CAUSES:
        out[f"computed {cause}"] = sum(c[cause] for c in index.computed_tokens) * index.scale
    return out


def _share(figures: dict[str, float], name: str) -> float:
    total = sum(v for k, v in figures.items() if k.startswith("computed"))
    return figures[name] / total if total else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replicas", type=int, default=1000)
    parser.add_argument("--requests", type=int, default=200_000)
    parser.add_argument("--gpu-blocks", type=int, default=512)
    parser.add_argument("--host-blocks", type=int, default=1024)
    parser.add_argument("--rates", nargs="+", default=["1", "1/16", "1/64"])
    parser.add_argument("--replica-rate", type=float, default=2500.0,
                        help="block events a second one replica publishes, for the fleet "
                        "size a rate carries (an 8B model at ~10k prefill tokens/s, blocks "
                        "of 16: ~625 GPU stores, as many removals, host stores and drops)")
    args = parser.parse_args()
    started = time.perf_counter()
    stream, block_events = make_stream(args.replicas, args.requests, args.gpu_blocks,
                                       args.host_blocks)
    print(f"{args.replicas} replicas, {len(stream):,} batches, {block_events:,} block events "
          f"(made in {time.perf_counter() - started:.1f} s)")
    exact: dict[str, float] | None = None
    carried = f"replicas at {args.replica_rate:.0f}/s"
    print(f"{'rate':>6} {'block events/s':>15} {carried:>18} {'index MiB':>10} "
          f"{'followed':>10}  worst error against the exact index: relative, or for a "
          "cause its share of the computed tokens")
    for text in args.rates:
        rate = float(Fraction(text))
        index = FleetIndex(Sampling(rate=rate, salt=12345))
        start = time.perf_counter()
        feed(index, stream, args.replicas)
        seconds = time.perf_counter() - start
        got = figures(index)
        followed = index.followed_blocks
        del index
        tracemalloc.start()
        index = FleetIndex(Sampling(rate=rate, salt=12345))
        feed(index, stream, args.replicas)
        memory = tracemalloc.get_traced_memory()[0] / 2**20
        tracemalloc.stop()
        del index
        if exact is None:
            exact = got
        errors = {name: abs(got[name] - exact[name]) / exact[name]
                  for name in exact if exact[name] > 0 and not name.startswith("computed")}
        for name in exact:  # a cause's share of the computed tokens, in points
            if name.startswith("computed"):
                errors[name + " share"] = abs(_share(got, name) - _share(exact, name))
        worst = max(errors, key=errors.__getitem__)
        rate_s = block_events / seconds
        print(f"{text:>6} {rate_s:>15,.0f} {rate_s / args.replica_rate:>18,.0f} "
              f"{memory:>10.1f} {followed:>10,}  {errors[worst]:.4f} ({worst}); "
              + ", ".join(f"{name} {errors[name]:.4f}" for name in sorted(errors)
                          if name != worst))


if __name__ == "__main__":
    main()
