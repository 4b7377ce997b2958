"""An engine process for the reliability benchmarks and tests: the demo's pool, unpaced.

It runs the reference tiered pool (what ``kvobs demo`` runs) with the chat workload as
fast as it can (``ServingLoop.run(pace=False)``: the engine at full rate), with every
sink of ``Telemetry.start`` on, and prints one JSON line per window of ``--window``
seconds: ``{"t": wall seconds, "ticks": loop steps in the window, "lookups": ...}``.
The first line is ``{"url": scrape URL}``. It stops after ``--duration`` seconds or when
its standard input closes (the parent died): it never outlives the benchmark.

Usage (normally started by benchmarks/reliability.py or tests/reliability):
    python benchmarks/reliability_engine.py --duration 20 [--otlp-endpoint URL]
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time

from kvobs.telemetry.coalesce import MIN_INTERVAL_S


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--window", type=float, default=0.5)
    parser.add_argument("--rate", type=float, default=20.0, help="conversations per second")
    parser.add_argument("--gpu-blocks", type=int, default=512)
    parser.add_argument("--host-blocks", type=int, default=2048)
    parser.add_argument("--otlp-endpoint", default=None)
    parser.add_argument("--otlp-interval", type=float, default=0.2)
    parser.add_argument("--otlp-timeout", type=float, default=0.5)
    parser.add_argument("--web-config-file", default=None)
    parser.add_argument("--server", choices=("plain", "coalesced"), default="plain",
                        help="plain: a collection per scrape (min interval 0; scrapes that "
                             "arrive during one still share it); coalesced: at most one "
                             "collection per --min-interval (what Telemetry serves)")
    parser.add_argument("--min-interval", type=float, default=MIN_INTERVAL_S,
                        help="coalesced: at most one collection per this many seconds "
                             "(default: Telemetry's)")
    args = parser.parse_args(argv)

    import structlog
    import torch

    from kvobs.pool import ServingLoop, TieredKVPool
    from kvobs.pool.workload import ChatWorkload, WorkloadConfig
    from kvobs.presets import preset_layout
    from kvobs.recorder import Recorder
    from kvobs.telemetry.otel import OtelBridge
    from kvobs.telemetry.otlp import otlp_reader
    from kvobs.telemetry.prometheus import start_metrics_server

    torch.set_num_threads(1)
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    layout = preset_layout("qwen2.5-0.5b")
    recorder = Recorder(engine="kvobs-demo", model=layout.name)
    pool = TieredKVPool(layout, args.gpu_blocks, args.host_blocks, recorder)
    loop = ServingLoop(pool, ChatWorkload(WorkloadConfig(rate=args.rate), seed=7))
    loop.run(30.0, pace=False)  # warm-up: full GPU tier, host hits, offloads
    server = start_metrics_server(
        "127.0.0.1:0", args.web_config_file,
        min_interval_s=args.min_interval if args.server == "coalesced" else 0.0)
    server.attach(recorder)
    readers = []
    if args.otlp_endpoint:
        readers.append(otlp_reader(args.otlp_endpoint, recorder, interval_s=args.otlp_interval,
                                   timeout_s=args.otlp_timeout))
    bridge = OtelBridge(recorder, readers) if readers else None
    print(json.dumps({"url": server.url}), flush=True)

    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    end = time.monotonic() + args.duration
    ticks = 0
    window_start, window_ticks, window_lookups = time.monotonic(), 0, recorder.lookups
    try:
        while not stop.is_set() and time.monotonic() < end:
            for _ in range(20):
                loop.step()
            ticks += 20
            now = time.monotonic()
            if now - window_start >= args.window:
                print(json.dumps({"t": now, "seconds": now - window_start,
                                  "ticks": ticks - window_ticks,
                                  "lookups": recorder.lookups - window_lookups,
                                  "errors": recorder.snapshot().errors}), flush=True)
                window_start, window_ticks, window_lookups = now, ticks, recorder.lookups
    finally:
        if bridge is not None:
            bridge.shutdown()
        server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
