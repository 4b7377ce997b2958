"""``kvobs fleet``: follow every replica's KV events, serve the fleet view on ``/metrics``.

Example:
    $ kvobs fleet --model llama-8b --metrics-addr 0.0.0.0:9465 \\
        --engine a=tcp://10.0.0.7:5557,replay=tcp://10.0.0.7:5558 \\
        --engine b=tcp://10.0.0.8:5557,replay=tcp://10.0.0.8:5558
"""

from __future__ import annotations

import argparse
import os
import signal
import threading
from typing import Any

from kvobs.cli.options import (
    add_option,
    address,
    at_most,
    input_file,
    non_negative_int,
    positive_float,
    positive_int,
)
from kvobs.errors import ConfigError

ENGINES_ENV = "KVOBS_FLEET_ENGINES"


def _rate(text: str) -> float:
    """A share: ``0.015625`` or ``1/64``."""
    top, sep, bottom = text.partition("/")
    if sep:
        try:
            value = float(top) / float(bottom)
        except (ValueError, ZeroDivisionError):
            raise argparse.ArgumentTypeError(f"{text!r} is not a rate: use a number such as "
                                             "0.015625 or a fraction such as 1/64") from None
        value = at_most(positive_float, 1.0)(repr(value))
    else:
        value = at_most(positive_float, 1.0)(text)
    if value < 2.0**-20:
        raise argparse.ArgumentTypeError(f"{text} is too small: use at least 2**-20")
    return value


def _shard(text: str) -> tuple[int, int]:
    shard, sep, shards = text.partition("/")
    if not (sep and shard.isdigit() and shards.isdigit() and 0 <= int(shard) < int(shards)
            <= 4096):
        raise argparse.ArgumentTypeError(f"{text!r} is not a shard: use I/N with "
                                         "0 <= I < N <= 4096 (0/1: the whole fleet)")
    return int(shard), int(shards)


def register(subparsers: Any) -> None:
    """Add the ``fleet`` subcommand."""
    parser = subparsers.add_parser(
        "fleet",
        help="follow replicas' KV events: duplication, routing misses, per-tier residency",
        description="Subscribe to the KV cache events each replica of a model publishes "
        "(vLLM and SGLang: --kv-events-config with publisher zmq; give each engine an "
        "endpoint such as tcp://*:5557 and a replay_endpoint such as tcp://*:5558) and "
        "serve on /metrics what the fleet holds per replica and tier, what it holds twice, "
        "and why each replica computed what it computed: routing (another replica held "
        "it), evicted, or cold. Replicas must hash blocks alike: the same model, block "
        "size and hash algorithm, and the same PYTHONHASHSEED where the engine reads it.",
    )
    parser.add_argument(
        "--engine", action="append", default=None, metavar="SPEC",
        help="a replica's publisher: [NAME=]tcp://HOST:PORT[,replay=tcp://HOST:PORT]"
        "[,topic=TOPIC][,model=MODEL]; repeat for each replica "
        f"[env {ENGINES_ENV}: specs separated by spaces]")
    add_option(parser, "--model", default="", env="KVOBS_FLEET_MODEL",
               help="the model label of replicas whose spec names none")
    add_option(parser, "--metrics-addr", type=address, default="127.0.0.1:9465",
               env="KVOBS_FLEET_METRICS_ADDR",
               help="HOST:PORT serving the fleet's /metrics (0.0.0.0:9465 in a pod)")
    add_option(parser, "--web-config-file", type=input_file, default=None,
               help="exporter-toolkit web config file for /metrics (TLS, basic auth)")
    add_option(parser, "--sample-rate", env="KVOBS_FLEET_SAMPLE_RATE", type=_rate, default=1.0,
               help="share of blocks followed, by a hash of the block (the same on every "
               "replica): 1 follows every block; 1/64 keeps a fleet of 1,000 replicas "
               "within one aggregator (docs/fleet.md)")
    add_option(parser, "--salt", env="KVOBS_FLEET_SALT", type=non_negative_int, default=0,
               help="the sampling hash's salt: the same on every aggregator of one fleet")
    add_option(parser, "--shard", env="KVOBS_FLEET_SHARD", type=_shard, default="0/1",
               help="I/N: follow the I-th of N hash ranges (N aggregators split a fleet)")
    add_option(parser, "--block-bytes", env="KVOBS_FLEET_BLOCK_BYTES", type=positive_int,
               default=None,
               help="bytes of one KV block (all layers), for kvobs_fleet_resident_bytes")
    add_option(parser, "--pooled-capacity", env="KVOBS_FLEET_POOLED_CAPACITY",
               type=positive_int, default=None,
               help="the fleet's GPU blocks, all replicas together: turns on the pooled "
               "what-if (the hits of one LRU cache shared by the fleet, at 1/8 to 16 times "
               "it); exact where the engines publish their prefix hits (vLLM: "
               "kv_cache_report_mode=full on the requests)")
    add_option(parser, "--history-blocks", env="KVOBS_FLEET_HISTORY_BLOCKS",
               type=positive_int, default=1 << 20,
               help="blocks no replica holds that are remembered as held before "
               "(about 100 bytes each)")
    add_option(parser, "--timeout", type=at_most(positive_float, 60.0), default=2.0,
               env="KVOBS_FLEET_TIMEOUT",
               help="seconds a replay or a liveness probe may take")
    add_option(parser, "--probe-interval", type=at_most(positive_float, 3600.0), default=10.0,
               env="KVOBS_FLEET_PROBE_INTERVAL",
               help="seconds between liveness probes of each replay endpoint (a replica "
               "that does not answer is read down and its blocks dropped)")
    parser.set_defaults(handler=run)


def engine_specs(args: argparse.Namespace) -> list[str]:
    """The ``--engine`` flags, else ``KVOBS_FLEET_ENGINES``'s specs."""
    if args.engine:
        return list(args.engine)
    return os.environ.get(ENGINES_ENV, "").split()


def run(args: argparse.Namespace) -> int:
    """Follow the engines until SIGTERM or Ctrl-C."""
    from kvobs.fleet.endpoints import parse_endpoints
    from kvobs.fleet.index import Sampling
    from kvobs.logs import get_logger

    endpoints = parse_endpoints(engine_specs(args), args.model)
    sampling = Sampling(args.sample_rate, args.salt, *args.shard)
    try:
        from kvobs.fleet.service import Fleet
    except ImportError as exc:
        raise ConfigError(f"kvobs fleet needs pyzmq and msgspec ({exc.name} is missing): "
                          "install the fleet extra (pip install -e '.[fleet]' in a "
                          "checkout)") from None
    fleet = Fleet(endpoints, args.metrics_addr, sampling=sampling,
                  history_keys=args.history_blocks, block_bytes=args.block_bytes,
                  pooled_capacity=args.pooled_capacity,
                  web_config_file=args.web_config_file, timeout_s=args.timeout,
                  probe_interval_s=args.probe_interval)
    log = get_logger("kvobs.fleet")
    log.info("fleet_started", url=fleet.url, replicas=len(endpoints),
             models=sorted(fleet.indexes), sample_rate=sampling.rate,
             shard=f"{sampling.shard}/{sampling.shards}")
    stop = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        stop.wait()
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        fleet.close()
        log.info("fleet_stopped")
    return 0
