"""``kvobs demo``: the reference tiered pool under a chat workload, serving ``/metrics``.

On a terminal the demo shows the ``kvobs top`` view of its own endpoint and writes its
logs to a file (``--log-file``); off a terminal, or with ``--view logs``, it logs JSON
lines to stderr as before. Every flag is checked before torch loads or a pool is
allocated: the address and its port, the OTLP URL, the log file, and whether the pools
fit in memory.

Example:
    $ kvobs demo --duration 60 --metrics-addr 127.0.0.1:9464
    $ curl -s 127.0.0.1:9464/metrics | grep kvobs_lookup_tokens_total
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from typing import Any

from kvobs.cli import demo_support
from kvobs.cli.model_options import add_model_options, layout_from_args
from kvobs.cli.options import (
    add_option,
    address,
    at_most,
    http_url,
    input_file,
    non_negative_float,
    non_negative_int,
    output_file,
    positive_float,
    positive_int,
)
from kvobs.errors import ConfigError

#: Most blocks per tier accepted on the command line (the memory check comes after).
MAX_BLOCKS = 2**31


def register(subparsers: Any) -> None:
    """Add the ``demo`` subcommand."""
    parser = subparsers.add_parser(
        "demo",
        help="run the reference tiered pool with a chat workload and serve /metrics",
        description="Run kvobs's reference GPU + host KV pool under a realistic multi-turn "
        "chat workload (shared system prompts, returning conversations), with every "
        "kvobs sink on: /metrics, optional OTLP push, structlog capacity and summary events.",
    )
    add_option(
        parser,
        "--duration",
        type=non_negative_float,
        default=0.0,
        help="seconds to run; 0 runs until interrupted",
    )
    add_option(
        parser,
        "--metrics-addr",
        type=address,
        default="127.0.0.1:9464",
        help="HOST:PORT serving /metrics (0.0.0.0:9464 inside a pod)",
    )
    add_option(
        parser,
        "--web-config-file",
        type=input_file,
        default=None,
        help="exporter-toolkit web config file for /metrics: TLS cert and key, optional "
        "client CA, basic auth with bcrypt hashes (the format of node_exporter's "
        "--web.config.file)",
    )
    add_option(
        parser,
        "--otlp-endpoint",
        type=http_url,
        default=None,
        help="OTLP/HTTP base URL to push to (also OTEL_EXPORTER_OTLP_ENDPOINT)",
    )
    add_option(
        parser,
        "--otlp-interval",
        type=at_most(positive_float, 86400.0),
        default=10.0,
        help="seconds between OTLP pushes",
    )
    add_model_options(parser, default_preset="qwen2.5-0.5b")
    add_option(
        parser,
        "--gpu-blocks",
        type=at_most(positive_int, MAX_BLOCKS),
        default=2048,
        help="blocks in the GPU tier",
    )
    add_option(
        parser,
        "--host-blocks",
        type=at_most(non_negative_int, MAX_BLOCKS),
        default=8192,
        help="blocks in the host tier (0: no host pool)",
    )
    add_option(
        parser,
        "--rate",
        type=at_most(positive_float, 1000.0),
        default=1.0,
        help="new conversations per second",
    )
    add_option(
        parser,
        "--warmup",
        type=at_most(non_negative_float, 3600.0),
        default=60.0,
        help="virtual seconds simulated at full speed before serving, so the "
        "tiers start in steady state (full GPU tier, host hits, offloads)",
    )
    add_option(
        parser,
        "--seed",
        type=at_most(non_negative_int, 2**63),
        default=0,
        help="workload seed (runs are reproducible)",
    )
    add_option(
        parser,
        "--request-tokens",
        type=at_most(positive_int, 2**30),
        default=8192,
        help="request length the capacity log interprets capacity for",
    )
    add_option(
        parser,
        "--thrash-window",
        type=at_most(positive_float, 86400.0),
        default=10.0,
        help="an onload this many seconds after its offload counts as thrash",
    )
    add_option(
        parser,
        "--summary-interval",
        type=non_negative_float,
        default=5.0,
        help="seconds between kv_cache_summary log events; 0 disables them",
    )
    add_option(
        parser,
        "--log-format",
        default="auto",
        choices=("auto", "json", "console"),
        help="log format: json when stderr is not a terminal under auto",
    )
    add_option(
        parser,
        "--view",
        default="auto",
        choices=("auto", "top", "logs"),
        help="top: the live kvobs top view; logs: log lines on stderr; auto: top when "
        "stdin and stdout are terminals",
    )
    add_option(
        parser,
        "--trace-out",
        type=output_file(),
        default=None,
        help="write every prefix lookup's block hashes (JSONL, hashes only) for "
        "`kvobs whatif --trace`, warm-up included",
    )
    add_option(
        parser,
        "--trace-max-bytes",
        type=at_most(positive_int, 2**40),
        default=256 << 20,
        help="stop tracing once the trace file reaches this size",
    )
    add_option(
        parser,
        "--log-file",
        type=output_file(),
        default=None,
        help="write the logs to this file (with the top view: default a file in the "
        "temporary directory, named on screen)",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Run the demo until ``--duration`` passes, SIGTERM or Ctrl-C."""
    layout = layout_from_args(args)  # every check before anything heavy happens
    demo_support.check_port_free(args.metrics_addr)
    if args.web_config_file:  # a bad file is one line naming the field, before torch
        from kvobs.telemetry.webconfig import load_web_config

        load_web_config(args.web_config_file)
    top = demo_support.want_top(args.view)
    if top and args.web_config_file:
        if args.view == "top":
            raise ConfigError("--view top cannot read a /metrics behind --web-config-file "
                              "(TLS or basic auth): use --view logs")
        top = False  # the terminal view reads plain HTTP only: show the logs instead
    torch = demo_support.import_torch()
    demo_support.check_gpu_holds_a_request(layout, args.gpu_blocks)  # kvobs.pool needs torch
    demo_support.check_memory(layout, args.gpu_blocks, args.host_blocks, torch.cuda.is_available())
    log_stream = demo_support.open_log(args, top)

    # Imported here so that `kvobs --help` and other subcommands start without torch.
    import structlog

    from kvobs.capacity import CapacityPlan
    from kvobs.exporter import Telemetry
    from kvobs.logs import configure_logging
    from kvobs.pool import ServingLoop, TieredKVPool
    from kvobs.pool.workload import ChatWorkload, WorkloadConfig
    from kvobs.recorder import Recorder
    from kvobs.telemetry.logs import log_capacity

    configure_logging(args.log_format, stream=log_stream)
    logger = structlog.get_logger("kvobs")
    # the reference pool copies a block to the host when the GPU evicts it: (nearly) one
    # tier at a time, so the cache holds GPU + host blocks
    recorder = Recorder(engine="kvobs-demo", model=layout.name, thrash_window_s=args.thrash_window,
                        exclusive_tiers=True)
    plan = CapacityPlan.from_blocks(
        layout,
        {"gpu": args.gpu_blocks, "host": args.host_blocks},
        request_tokens=args.request_tokens,
    )
    pool = TieredKVPool(layout, args.gpu_blocks, args.host_blocks, recorder)
    loop = ServingLoop(pool, ChatWorkload(WorkloadConfig(rate=args.rate), seed=args.seed))
    if args.trace_out:
        recorder.open_trace(args.trace_out, args.trace_max_bytes, clock=lambda: loop.now_s)
    log_capacity(plan, logger)
    loop.run(args.warmup, pace=False)
    telemetry = Telemetry.start(
        recorder,
        logger,
        metrics_addr=args.metrics_addr,
        otlp_endpoint=args.otlp_endpoint,
        otlp_interval_s=args.otlp_interval,
        web_config_file=args.web_config_file,
        summary_interval_s=args.summary_interval,
    )
    stop = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    logger.info(
        "demo_started",
        device=str(pool.gpu.device),
        duration_s=args.duration or None,
        rate=args.rate,
        seed=args.seed,
    )
    try:
        if top and telemetry.metrics_url:
            demo_support.run_with_view(loop, args.duration or None, stop, telemetry.metrics_url,
                           f"logs: {args.log_file}")
        else:
            loop.run(args.duration or None, pace=True, should_stop=stop.is_set)
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        if telemetry.summary is not None:
            telemetry.summary.log_now()
        telemetry.close()
        if recorder.trace is not None:
            recorder.trace.close()
        logger.info("demo_stopped", virtual_s=round(loop.now_s, 2), **vars(loop.stats))
        if log_stream is not None:
            log_stream.close()
    if top:
        print(f"kvobs demo: logs in {args.log_file}", file=sys.stderr)
    return 0
