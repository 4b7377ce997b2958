"""``kvobs top`` in a 100-column terminal: a busy four-tier engine's panel, every figure
whole (no line past the edge, no cell cut to ``…``)."""

import io

import pytest
from rich.console import Console

from kvobs.top import build_view, parse_text
from kvobs.top.render import render_view

GIB = 1024**3
LABELS = 'engine="vllm",model="meta-llama/Llama-3.1-70B-Instruct"'
#: tier: capacity blocks, in use, cached, capacity bytes (2.5 MiB blocks)
TIERS = {"gpu": (40_400, 30_000, 9_000, 1010 * GIB), "host": (409_600, 100_000, 300_000, 10**12),
         "disk": (4_000_000, 1_000_000, 2_500_000, 10 * 1024 * GIB),
         "remote": (40_000_000, 5_000_000, 30_000_000, 100 * 1024 * GIB)}
#: direction: bytes/s, blocks/s, drops/s, failures/s, bucket counts per second
LINKS = {("gpu", "host"): (12.3e9, 4_920, 1_234, 45.6, {0.001: 2_000, 0.01: 4_800}),
         ("host", "gpu"): (23.4e9, 9_360, 0, 0, {0.001: 9_000, 0.01: 9_300}),
         ("host", "disk"): (1.5e9, 600, 123, 4.5, {0.01: 300, 0.1: 594}),
         ("disk", "host"): (2.5e9, 1_000, 0, 0, {0.01: 700, 0.1: 990}),
         ("host", "remote"): (0.9e9, 360, 12.5, 1.25, {0.1: 180, 1.0: 356}),
         ("remote", "host"): (1.1e9, 440, 0, 3.5, {0.1: 300, 1.0: 436})}

#: p50 and p99 of each direction, as the buckets above interpolate them
LATENCIES = {("gpu", "host"): ("2.48 ms", "10 ms"), ("host", "gpu"): ("520 µs", "8.99 ms"),
             ("host", "disk"): ("10 ms", "100 ms"), ("disk", "host"): ("7.14 ms", "100 ms"),
             ("host", "remote"): ("100 ms", "1 s"), ("remote", "host"): ("73.3 ms", "997 ms")}


def exposition(t, far):
    """A scrape ``t`` seconds after the engine started, every counter at its rate; the
    fourth tier named ``far``."""
    rows = [f'kvobs_lookups_total{{{LABELS}}} {1_234 * t}',
            f'kvobs_thrash_onloads_total{{{LABELS}}} {12.3 * t}',
            f'kvobs_offloaded_reused_blocks_total{{{LABELS}}} {1_234_567 * t}',
            f'kvobs_offloaded_evicted_unused_blocks_total{{{LABELS}}} {2_345_678 * t}',
            f'kvobs_instrumentation_errors_total{{{LABELS}}} 3']
    for outcome, per_s in (("gpu_hit", 6e5), ("host_hit", 3e5), ("disk_hit", 5e4), ("miss", 5e4)):
        rows.append(f'kvobs_lookup_tokens_total{{{LABELS},outcome="{outcome}"}} {per_s * t}')
    for tier, (capacity, in_use, cached, capacity_bytes) in TIERS.items():
        block = capacity_bytes / capacity
        rows += [f'kvobs_tier_capacity_blocks{{{LABELS},tier="{tier}"}} {capacity}',
                 f'kvobs_tier_capacity_bytes{{{LABELS},tier="{tier}"}} {capacity_bytes}']
        for state, blocks in (("in_use", in_use), ("cached", cached)):
            rows += [f'kvobs_tier_resident_blocks{{{LABELS},tier="{tier}",state="{state}"}} '
                     f"{blocks}",
                     f'kvobs_tier_resident_bytes{{{LABELS},tier="{tier}",state="{state}"}} '
                     f"{blocks * block}"]
    for (src, dst), (bytes_s, blocks_s, drops_s, fails_s, buckets) in LINKS.items():
        link = f'{LABELS},src_tier="{src}",dst_tier="{dst}"'
        rows += [f"kvobs_transfer_bytes_total{{{link}}} {bytes_s * t}",
                 f"kvobs_transfer_blocks_total{{{link}}} {blocks_s * t}",
                 f"kvobs_transfer_drops_total{{{link}}} {drops_s * t}",
                 f"kvobs_transfer_failures_total{{{link}}} {fails_s * t}"]
        for le, count in [*buckets.items(), ("+Inf", blocks_s)]:
            rows.append(f'kvobs_transfer_duration_seconds_bucket{{{link},le="{le}"}} {count * t}')
    return "\n".join(rows).replace('"remote"', f'"{far}"') + "\n"


def screen(width, far="remote"):
    url = "http://inference-node-17.cluster.local:9400/metrics"
    view = build_view(parse_text(exposition(1000, far), 1000.0, url),
                      parse_text(exposition(999, far), 999.0, url))
    console = Console(width=width, record=True, color_system=None, file=io.StringIO())
    console.print(render_view(view, width))
    return console.export_text()


@pytest.mark.parametrize("width,far", [(100, "remote"), (120, "remote"),
                                       (100, "remote_nvme"), (100, "a_sixteen_char_t")])
def test_a_busy_four_tier_engine_reads_whole_in_100_columns(width, far):
    """``far``: the fourth tier's name, up to the 16 characters a tier name may have."""
    text = screen(width, far)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= width, text
    assert "…" not in text, text  # no figure cut short
    for tier in ("gpu", "host", "disk", far):
        assert any(line.startswith(f"│ {tier} ") and "█" in line for line in lines), text
    # bytes: used / capacity, in the unit that keeps them below 1024
    assert "1,010 GiB" in text and "931 GiB" in text and "10 TiB" in text, text
    for (src, dst), (p50, p99) in LATENCIES.items():
        name = f"{src}→{dst}".replace("remote", far)
        row = next((line for line in lines if f" {name} " in line), "")
        assert p50 in row and p99 in row, (src, dst, p50, p99, text)
    assert "drop 1.23k/s" in text and "fail 45.6/s" in text
    for figure in ("thrash 12.3/s", "wasted offloads 66%", "instrumentation errors 3",
                   "gpu 60%", "miss 5%"):
        assert figure in text, (figure, text)


def test_the_tables_stay_in_a_100_column_terminal():
    text = screen(100)
    lines = text.splitlines()
    assert any("in use" in line and "bytes used" in line for line in lines), text
    assert any("throughput" in line and "p99" in line for line in lines), text
