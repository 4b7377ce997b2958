"""``kvobs whatif``: the hit ratio a cache of another size would get, from a trace or a fleet.

Example:
    $ kvobs demo --duration 120 --trace-out chat.jsonl
    $ kvobs whatif --trace chat.jsonl --sizes 1024,2048,4096,8192
    $ kvobs whatif --trace chat.jsonl --model qwen2.5-0.5b --gpu-gib 0.375 \\
          --host-gib 1.5,3 --json
    $ kvobs whatif --prometheus http://127.0.0.1:9090 --window 1h --sizes 4096,16384

With ``--prometheus`` engines are summed only within one configured capacity: one curve
(one table, one JSON entry under ``curves``) per capacity; with a single capacity the
JSON also carries that curve's fields at the top, as for a trace.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from kvobs.cli.model_options import add_model_options, layout_from_args
from kvobs.cli.options import add_flag, add_option, http_url, input_file
from kvobs.errors import ConfigError

GIB = 2**30


def _numbers(flag: str, integers: bool) -> Any:
    def parse(text: str) -> list[float]:
        values = []
        for part in str(text).split(","):
            try:
                value = float(part)
            except ValueError:
                raise argparse.ArgumentTypeError(
                    f"{part.strip()!r} is not a number: pass a comma-separated list, e.g. "
                    f"{'1024,4096' if integers else '64,128'}") from None
            if not 0 < value < float("inf") or (integers and value != int(value)):
                kind = "positive whole numbers of blocks" if integers else "positive GiB"
                raise argparse.ArgumentTypeError(f"{part.strip()!r}: {flag} takes {kind}")
            values.append(int(value) if integers else value)
        return values

    return parse


def register(subparsers: Any) -> None:
    """Add the ``whatif`` subcommand."""
    parser = subparsers.add_parser(
        "whatif",
        help="predict the hit ratio of other cache sizes from a trace or a running fleet",
        description="Predict the LRU hit ratio of block references for other cache sizes: "
        "from a JSONL trace of prefix lookups (kvobs demo --trace-out, or an engine "
        "adapter's trace), or from a Prometheus that scrapes kvobs (the reuse profile). "
        "A fleet's engines are summed only within one configured capacity "
        "(kvobs_reuse_capacity_blocks): each engine's buckets are multiples of its own "
        "size, so engines of different sizes get one curve each, smallest first.",
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--trace", type=input_file, metavar="FILE",
                        help='JSONL trace, one lookup per line: {"blocks": ["<hash>", ...], '
                        '"ts": seconds}')
    source.add_argument("--prometheus", type=http_url, metavar="URL",
                        help="Prometheus base URL scraping kvobs engines: one curve per "
                        "configured capacity, summed over the engines of that capacity "
                        "(a series missing from Prometheus is named, exit status 2)")
    add_option(parser, "--window", default="1h",
               help="with --prometheus: the window to read, as a PromQL duration")
    add_option(parser, "--selector", default="",
               help='with --prometheus: label matchers, e.g. engine="vllm"')
    add_option(parser, "--sizes", type=_numbers("--sizes", integers=True), default=None,
               metavar="N,N,...", help="cache sizes in blocks (default: powers of two)")
    add_option(parser, "--gpu-gib", type=_numbers("--gpu-gib", integers=False),
               default=None, metavar="GIB",
               help="with a model: the GPU tier's KV size; --host-gib sizes are then "
               "answered as host hit ratios")
    add_option(parser, "--host-gib", type=_numbers("--host-gib", integers=False),
               default=None, metavar="GIB,GIB,...", help="host pool sizes to compare")
    add_flag(parser, "--exclusive",
             help="tiers hold disjoint blocks (default: the host keeps copies of GPU blocks)")
    add_model_options(parser, default_preset=None)
    add_flag(parser, "--json", help="print JSON instead of a table")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Build the curve and print the answer."""
    from kvobs import whatif

    gib_mode = args.gpu_gib is not None or args.host_gib is not None
    if gib_mode and (args.gpu_gib is None or args.host_gib is None or len(args.gpu_gib) != 1):
        raise ConfigError("--gpu-gib GIB and --host-gib GIB,GIB,... go together (one GPU "
                          "size): e.g. --gpu-gib 16 --host-gib 64,128")
    layout = layout_from_args(args) if gib_mode else None
    if args.trace:
        with open(args.trace, encoding="utf-8") as lines:
            curves = [whatif.curve_from_trace(lines, source=args.trace)]
    else:
        from kvobs.report.prometheus_api import PrometheusClient, QueryFailed

        try:
            curves = whatif.curves_from_prometheus(PrometheusClient(args.prometheus),
                                                   args.window, args.selector)
        except QueryFailed as exc:
            raise ConfigError(f"--prometheus: {exc}") from None
    if layout is not None:
        for curve in curves:
            _print_tiers(args, curve, layout.bytes_per_block, layout.name)
        return 0
    answers = [(curve, whatif.table(curve, args.sizes or _default_sizes(curve)))
               for curve in curves]
    if args.json:
        entries = [_json_entry(curve, rows) for curve, rows in answers]
        if args.trace:
            print(json.dumps(entries[0], indent=2))
            return 0
        # A fleet: every capacity under "curves"; with one capacity its entry's fields
        # are also at the top, as for a trace.
        one = entries[0] if len(entries) == 1 else {"source": curves[0].source}
        print(json.dumps({**one, "curves": entries}, indent=2))
        return 0
    for curve, rows in answers:
        kind = "exact LRU replay" if curve.exact else _profile_kind(
            curve.tracking_rate, curve.exact_blocks,
            max(row["blocks"] for row in rows) if rows else 0.0)
        fleet = "" if curve.capacity_blocks is None else (
            f", {curve.engines} engine{'s' * (curve.engines != 1)} of "
            f"{curve.capacity_blocks:,.0f} blocks")
        print(f"{curve.source}: {curve.references:,.0f} block references ({kind}{fleet})")
        print(f"{'blocks':>12}  hit ratio")
        for row in rows:
            print(f"{row['blocks']:>12,.0f}  {row['hit_ratio']:8.2%}")
    return 0


def _profile_kind(tracking_rate: float | None, exact_blocks: float | None = None,
                  largest: float = 0.0) -> str:
    """How a fleet curve was measured, as its engines' profiles say (``largest``: the
    largest size asked for)."""
    if tracking_rate is not None and tracking_rate >= 1.0:
        return "every block tracked: exact at the bucket bounds"
    if exact_blocks and exact_blocks >= largest:
        return f"exact at the bucket bounds up to {exact_blocks:,.0f} blocks"
    sampled = "sampled profile" if tracking_rate is None else \
        f"sampled profile, {tracking_rate:g} of blocks tracked"
    if exact_blocks:
        return f"exact at the bucket bounds up to {exact_blocks:,.0f} blocks, {sampled} beyond"
    return sampled


def _json_entry(curve: Any, rows: list[dict[str, float]]) -> dict[str, Any]:
    entry: dict[str, Any] = {"source": curve.source, "references": curve.references,
                             "exact": curve.exact, "sizes": rows}
    if curve.capacity_blocks is not None:
        entry.update(capacity_blocks=curve.capacity_blocks, engines=curve.engines,
                     tracking_rate=curve.tracking_rate, exact_blocks=curve.exact_blocks)
    return entry


def _default_sizes(curve: Any) -> list[float]:
    if curve.capacity_blocks is not None:  # a fleet curve: its exported bucket bounds
        return [bound for bound, _ in curve._points]
    sizes, size = [], 256
    while size <= max(curve.references, 256):
        sizes.append(float(size))
        size *= 2
    return sizes


def _print_tiers(args: argparse.Namespace, curve: Any, block_bytes: int, model: str) -> None:
    from kvobs.whatif import host_hit_ratio

    inclusive = not args.exclusive
    gpu_gib = args.gpu_gib[0]
    gpu_blocks = gpu_gib * GIB / block_bytes
    gpu_hit = curve.hit_ratio(gpu_blocks)
    rows = [{"host_gib": gib, "host_blocks": gib * GIB / block_bytes,
             "host_hit_ratio": host_hit_ratio(curve, gpu_blocks, gib * GIB / block_bytes,
                                              inclusive)}
            for gib in args.host_gib]
    if args.json:
        print(json.dumps({"source": curve.source, "model": model, "references": curve.references,
                          "exact": curve.exact, "inclusive": inclusive, "gpu_gib": gpu_gib,
                          "gpu_blocks": gpu_blocks, "gpu_hit_ratio": gpu_hit, "host": rows},
                         indent=2))
        return
    fleet = "" if curve.capacity_blocks is None else \
        f" [engines of {curve.capacity_blocks:,.0f} blocks]"
    print(f"{model}{fleet}: GPU {gpu_gib:g} GiB = {gpu_blocks:,.0f} blocks: GPU hits {gpu_hit:.0%}")
    line = " -> ".join(f"{row['host_gib']:g}" for row in rows)
    hits = " -> ".join(f"{row['host_hit_ratio']:.0%}" for row in rows)
    print(f"host pool {line} GiB: host hits {hits}"
          f" ({'inclusive' if inclusive else 'exclusive'} tiers)")
