"""``kvobs capacity``: plan tier capacities for a model without running an engine.

Example:
    $ kvobs capacity --model llama-3-8b --gpu-kv-gib 16 --host-pool-gib 120 --request-tokens 32768
"""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

from kvobs.capacity import GIB, CapacityPlan
from kvobs.cli.model_options import add_model_options, layout_from_args
from kvobs.cli.options import (
    add_flag,
    add_option,
    at_most,
    non_negative_float,
    positive_float,
    positive_int,
)
from kvobs.errors import ConfigError
from kvobs.tiers import CACHE, ROLES

#: Largest tier size accepted, in GiB (1 PiB): anything above is a typo.
MAX_GIB = 2.0**20


def register(subparsers: Any) -> None:
    """Add the ``capacity`` subcommand."""
    parser = subparsers.add_parser(
        "capacity",
        help="print the KV capacity of every tier for a model",
        description="Plan KV cache capacity per tier. The GPU tier bounds how many requests "
        "run at once; the host and disk tiers bound how much reusable context is kept, "
        "unless the host pool is the primary store (--host-role primary): then the "
        "smaller of the two limits bounds concurrency.",
    )
    add_model_options(parser, default_preset=None)
    add_option(
        parser,
        "--gpu-kv-gib",
        type=at_most(positive_float, MAX_GIB),
        required=False,
        help="GiB of GPU memory given to the KV cache",
    )
    add_option(
        parser,
        "--host-pool-gib",
        type=at_most(non_negative_float, MAX_GIB),
        default=0.0,
        help="GiB of host DRAM given to the KV host pool",
    )
    add_option(
        parser,
        "--disk-gib",
        type=at_most(non_negative_float, MAX_GIB),
        default=0.0,
        help="GiB of disk given to the KV disk tier",
    )
    add_option(
        parser,
        "--request-tokens",
        type=at_most(positive_int, 2**30),
        default=8192,
        help="request length (prompt + output) used to interpret capacity",
    )
    add_option(
        parser,
        "--host-role",
        choices=ROLES,
        default=CACHE,
        help="cache: the host pool keeps reusable prefixes (offloading connector, SGLang "
        "HiCache, LMCache); primary: it is the engine's primary KV store, every running "
        "request needs blocks there and it bounds concurrency too (vLLM HiSparse)",
    )
    add_flag(parser, "--json", help="print JSON instead of a table")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Print the capacity plan."""
    if args.gpu_kv_gib is None:
        raise ConfigError("--gpu-kv-gib is required: pass the GiB of GPU memory for the KV cache")
    layout = layout_from_args(args)
    for flag, gib in (("--gpu-kv-gib", args.gpu_kv_gib), ("--host-pool-gib", args.host_pool_gib),
                      ("--disk-gib", args.disk_gib)):
        if gib and gib * GIB < layout.bytes_per_block:  # 0 host or disk means no such tier
            raise ConfigError(
                f"{flag} {gib:g} holds no KV block of {layout.name} "
                f"({layout.bytes_per_block:,} bytes per block of {layout.block_tokens} tokens): "
                f"pass {flag} {_round_up(layout.bytes_per_block / GIB)} or more"
            )
    sizes = {"gpu": args.gpu_kv_gib * GIB, "host": args.host_pool_gib * GIB}
    if args.disk_gib:
        sizes["disk"] = args.disk_gib * GIB
    plan = CapacityPlan.from_bytes(layout, sizes, request_tokens=args.request_tokens,
                                   roles={"host": args.host_role})
    if args.json:
        print(json.dumps(plan.as_event(), indent=2))
    else:
        print(
            f"model {layout.name}: {layout.bytes_per_token:,} bytes/token, "
            f"{layout.block_tokens} tokens/block = {layout.bytes_per_block:,} bytes/block"
            f"{' (MLA)' if layout.is_mla else ''}"
        )
        for line in plan.describe():
            print(line)
    return 0


def _round_up(gib: float) -> str:
    """``gib`` rounded up to three significant digits, so that it holds a block."""
    scale = 10.0 ** (2 - math.floor(math.log10(gib)))
    return f"{math.ceil(gib * scale) / scale:g}"
