"""The periodic ``kv_cache_summary`` event: occupancy, hit split, transfer rates, thrash.

Rates are computed from two snapshots, so the summary costs the engine nothing.

Example:
    >>> from kvobs.recorder import Recorder
    >>> rec = Recorder()
    >>> _ = rec.add_tier("gpu", capacity_blocks=10, block_tokens=16, block_bytes=64)
    >>> before = rec.snapshot(); rec.lookup(100, gpu_hit=60); rec.tier("gpu").allocate(5)
    >>> fields = summary_fields(before, rec.snapshot(), elapsed_s=2.0)
    >>> fields["tiers"]["gpu"]["occupancy"], fields["lookup_tokens"]["gpu_hit"]
    (0.5, 0.6)
"""

from __future__ import annotations

import threading
import time
from typing import Any

from kvobs.misses import miss_sentence
from kvobs.recorder import Recorder
from kvobs.snapshot import RecorderSnapshot


def summary_fields(
    prev: RecorderSnapshot, cur: RecorderSnapshot, elapsed_s: float
) -> dict[str, Any]:
    """Fields of one summary event covering the interval from ``prev`` to ``cur``."""
    elapsed = max(elapsed_s, 1e-9)
    tokens = cur.lookups.tokens - prev.lookups.tokens
    prev_outcomes = prev.lookups.outcomes()
    split = {
        outcome: round((n - prev_outcomes[outcome]) / tokens, 4) if tokens else 0.0
        for outcome, n in cur.lookups.outcomes().items()
    }
    transfers = {}
    for link in cur.links:
        try:
            old = prev.link(link.src, link.dst)
            ops, nbytes, blocks = (
                link.operations - old.operations,
                link.bytes - old.bytes,
                link.blocks - old.blocks,
            )
        except KeyError:
            ops, nbytes, blocks = link.operations, link.bytes, link.blocks
        transfers[f"{link.src}->{link.dst}"] = {
            "blocks_per_s": round(blocks / elapsed, 1),
            "bytes_per_s": round(nbytes / elapsed),
            "ops": ops,
            "failures": link.failures,
            "drops": link.drops,
        }
    return {
        "interval_s": round(elapsed, 2),
        "host_pool": host_pool_verdict(prev, cur, elapsed),
        "tiers": {
            t.tier: {
                "in_use": t.in_use_blocks,
                "cached": t.cached_blocks,
                "free": t.free_blocks,
                "occupancy": round(t.occupancy, 4),
                "evictions": t.evictions_total,
            }
            for t in cur.tiers
        },
        "lookup_tokens_per_s": round(tokens / elapsed, 1),
        "lookup_tokens": split,
        "misses": misses_verdict(prev, cur),
        "transfers": transfers,
        "thrash_onloads": cur.thrash.onloads_in_window,
        "offloaded_reused": cur.thrash.offloaded_reused,
        "offloaded_evicted_unused": cur.thrash.offloaded_evicted_unused,
        "instrumentation_errors": sum(cur.errors.values()),
    }


def misses_verdict(prev: RecorderSnapshot, cur: RecorderSnapshot) -> str:
    """One sentence: the share of the interval's looked-up tokens that missed, by cause,
    and what twice the capacity would win back of the evicted ones.

    Example:
        >>> from kvobs.recorder import Recorder
        >>> rec = Recorder()
        >>> _ = rec.add_tier("gpu", 4, block_tokens=16, block_bytes=0)
        >>> before = rec.snapshot(); rec.lookup(40, keys=["a", "b"])
        >>> misses_verdict(before, rec.snapshot())
        '100% of prompt tokens missed: 80% never seen, 20% in partial blocks'
    """
    now, then = cur.lookups.miss_causes(), prev.lookups.miss_causes()
    causes = {cause: now[cause] - then[cause] for cause in now}
    return miss_sentence(cur.lookups.tokens - prev.lookups.tokens, causes,
                         cur.lookups.recoverable - prev.lookups.recoverable)


def host_pool_verdict(prev: RecorderSnapshot, cur: RecorderSnapshot,
                      elapsed_s: float) -> str:
    """One sentence: the prefill the host pool's hits saved against their onload time.

    Example:
        >>> from kvobs.recorder import Recorder
        >>> rec = Recorder()
        >>> rec.prefill_cost.set(0.01)
        >>> before = rec.snapshot()
        >>> rec.lookup(1000, host_hit=800); rec.link("host", "gpu").transfer(50, 0, 0.5)
        >>> host_pool_verdict(before, rec.snapshot(), 600.0)
        'host pool saved 8 s of prefill for 0.5 s of onload in the last 10 min (net +7.5 s)'

    Onloads the engine did not time (blocks moved, no seconds) or no onload link at all
    make the onload time unknown, never 0 s.
    """
    source = cur.benefit.prefill_cost_source
    window = (f"{elapsed_s / 60:.0f} min" if elapsed_s >= 120 else
              f"{elapsed_s:.0f} s" if elapsed_s >= 10 else f"{elapsed_s:.3g} s")  # 0.05 s
    saved = cur.benefit.host_saved_s - prev.benefit.host_saved_s
    untimed = ("host pool: onload time unknown (the engine does not time its onloads); "
               + ("prefill cost unknown" if source == "none" else
                  f"{_seconds(saved)} s of prefill saved") + f" in the last {window}")
    try:
        now = cur.link("host", "gpu")
    except KeyError:
        return untimed if any(t.tier == "host" for t in cur.tiers) else "no host pool"
    try:
        then = prev.link("host", "gpu")
        onload, blocks = now.seconds - then.seconds, now.blocks - then.blocks
    except KeyError:
        onload, blocks = now.seconds, now.blocks
    if blocks and not onload:
        return untimed
    if source == "none":
        return (f"host pool: prefill cost unknown (set KVOBS_PREFILL_SECONDS_PER_TOKEN); "
                f"{onload:.1f} s of onload in the last {window}")
    return (f"host pool saved {_seconds(saved)} s of prefill for {_seconds(onload)} s of "
            f"onload in the last {window} (net {_seconds(saved - onload, sign=True)} s)")


def _seconds(value: float, sign: bool = False) -> str:
    """Seconds to one decimal from 10 s, else three significant digits (0.00412)."""
    spec = ("+" if sign else "") + (".1f" if abs(value) >= 10 else ".3g")
    return format(value, spec)


class SummaryLogger:
    """Logs ``kv_cache_summary`` every ``interval_s`` from a daemon thread."""

    def __init__(self, recorder: Recorder, logger: Any, interval_s: float = 10.0) -> None:
        self._recorder = recorder
        self._logger = logger
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kvobs-summary", daemon=True)
        self._last = recorder.snapshot()
        self._last_t = time.monotonic()

    def start(self) -> SummaryLogger:
        """Start the thread; returns self."""
        self._thread.start()
        return self

    def log_now(self) -> dict[str, Any]:
        """Log a summary of the interval since the last one, and return its fields."""
        cur, now = self._recorder.snapshot(), time.monotonic()
        fields = summary_fields(self._last, cur, now - self._last_t)
        self._last, self._last_t = cur, now
        self._logger.info("kv_cache_summary", **fields)
        return fields

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                self.log_now()
            except Exception as exc:
                self._recorder.error("telemetry.summary", exc)

    def stop(self) -> None:
        """Stop the thread."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
