"""The host pool's net benefit per data-parallel rank, on a real Prometheus scraping the
real data-parallel engine.

vLLM's data-parallel engine (``engine_run_dp.py``: ``AsyncLLM`` with
``data_parallel_size=2`` as ``vllm serve`` runs it; per rank an engine-core and a worker
process, kvobs enabled in all four) runs a workload pinned per rank with a configured
prefill cost, while a real Prometheus scrapes the two kvobs endpoints, one per engine,
every second with the shipped recording rules loaded (the engine holds before its first
request and after its last, as in ``test_vllm_net_benefit.py``).

Truth is vLLM's own registry, which keeps each rank apart (its ``engine`` label): per
rank, its external (host) prefix-cache hit tokens times the configured cost is the
saving and its ``vllm:kv_offload_load_time`` the onload time. The rule must give one
answer per rank, from that rank's engine core, equal to that rank's saving minus its
onload time; nothing may be counted twice across ranks or processes.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.engines.vllm032.held_run import (
    NET,
    answer,
    final_net,
    held_engine,
    one,
    prometheus,
    query,
)

#: Prefill seconds per token (configured), as in ``test_vllm_net_benefit.py``.
COST = 1e-5
DP = 2
SAVED = 'kvobs_prefill_saved_seconds_total{tier="host"}'
ONLOAD = 'kvobs_transfer_seconds_total{src_tier="host",dst_tier="gpu"}'
FLEET = "model:kvobs_host_pool_net_benefit_seconds:rate5m"


@dataclass(frozen=True)
class Endpoints:
    """kvobs's documented endpoints of a DP engine with one worker per rank: the engine
    core of rank r on ``base + r``; its worker's (opt-in, not asked for here) would be
    ``base + 100 + r``."""

    base: int

    def core(self, rank: int) -> str:
        return f"127.0.0.1:{self.base + rank}"

    def worker(self, rank: int) -> str:
        return f"127.0.0.1:{self.base + 100 + rank}"

    def ranks(self) -> dict[str, tuple[str, str | None]]:
        """Per endpoint, the ``(dp_rank, tp_rank)`` its series must carry."""
        return {self.core(r): (str(r), None) for r in range(DP)}


@dataclass(frozen=True)
class RankFigures:
    """One rank's figures on Prometheus, read at the rule's evaluation."""

    net: float
    saved_rate: float
    saved: float
    onload: float


def served_ranks(url: str, at: float) -> dict[str, set[tuple[str, str | None]]]:
    """Per scraped endpoint, the ``(dp_rank, tp_rank)`` pairs on its kvobs series."""
    found: dict[str, set[tuple[str, str | None]]] = {}
    for row in query(url, 'count by (instance, dp_rank, tp_rank) ({__name__=~"kvobs_.+"})',
                     at):
        labels = row["metric"]
        found.setdefault(labels["instance"], set()).add(
            (labels.get("dp_rank", ""), labels.get("tp_rank")))
    return found


def rank_figures(url: str, core: str, net: float, at: float) -> RankFigures:
    """The rank's answer, and its saving (rate and total) and onload time."""
    saved, onload = (name.replace("}", f',instance="{core}"}}') for name in (SAVED, ONLOAD))
    return RankFigures(net=net, saved_rate=one(url, f"rate({saved}[5m])", at),
                       saved=one(url, saved, at), onload=one(url, onload, at))


def by_instance(rows: list[dict[str, Any]]) -> dict[str | None, float]:
    """A query's samples by their ``instance`` label (each one's own, none without)."""
    found = {row["metric"].get("instance"): float(row["value"][1]) for row in rows}
    assert None not in found and len(found) == len(rows), \
        f"not one sample per process (a join across processes?): {rows}"
    return found


def test_net_benefit_per_rank_is_the_ranks_saving_minus_its_onload_time(
        tmp_path: Path) -> None:
    with held_engine("engine_run_dp.py", [], tmp_path,
                     KVOBS_PREFILL_SECONDS_PER_TOKEN=repr(COST)) as engine:
        ports = Endpoints(engine.ready()["kvobs_port"])
        targets = list(ports.ranks())
        with prometheus(tmp_path, targets) as url:
            engine.wait("Prometheus to scrape every process", lambda: True if answer(
                url, f"count(kvobs_lookups_total) == {len(targets)} and "
                     f"count(up == 1) == {len(targets)}") else None, 60)
            engine.go()
            at, rows = final_net(url, engine, engine.done())
            ranks = served_ranks(url, at)
            net = by_instance(rows)
            figures = {rank: rank_figures(url, ports.core(rank), net.get(ports.core(rank),
                                                                         float("nan")), at)
                       for rank in range(DP)}
            totals = {name: by_instance(query(url, f"{name} > 0", at))
                      for name in (SAVED, ONLOAD)}
            fleet_at = one(url, f"timestamp({FLEET})")
            fleet, summed = one(url, FLEET, fleet_at), one(url, f"sum({NET})", fleet_at)
    vllm = engine.vllm()
    assert engine.account()["left_running"] == []

    # Every process serves its own rank on its own documented port: kvobs reads the rank
    # vLLM keeps for a dense model's independent DP ranks (data_parallel_index).
    assert ranks == {endpoint: {pair} for endpoint, pair in ports.ranks().items()}
    # No worker serves an endpoint unless asked (KVOBS_WORKER_METRICS).
    for rank in range(DP):
        host, port = ports.worker(rank).split(":")
        with pytest.raises(OSError):
            socket.create_connection((host, int(port)), timeout=1).close()
    # One answer per rank, from its engine core.
    assert sorted(net) == sorted(ports.core(r) for r in range(DP)), rows
    truth = {rank: (vllm.total("vllm:external_prefix_cache_hits_total", engine=str(rank))
                    * COST, vllm.total("vllm:kv_offload_load_time_total", engine=str(rank)))
             for rank in range(DP)}
    for rank, got in figures.items():
        saved, onload = truth[rank]
        print(f"dp_rank {rank}: kvobs {got}; vLLM saved {saved!r} s, onload {onload!r} s")
        assert got.saved == pytest.approx(saved, rel=1e-9) and saved > 0, (rank, got)
        assert got.onload == pytest.approx(onload, rel=1e-9) and onload > 0, (rank, got)
        # as in test_vllm_net_benefit.py: the saving's rate times (1 - the rank's onload
        # time / its saving), both vLLM's, read when the rule was evaluated
        assert got.net == pytest.approx(got.saved_rate * (1 - onload / saved), rel=0.005), \
            (rank, got, truth[rank])
    assert truth[0][0] != truth[1][0], "the ranks' savings must differ (probe lengths)"
    # Nothing counted twice: over every process of every rank, the savings and onload
    # times add up to vLLM's, and only the engine cores count them.
    assert sum(totals[SAVED].values()) == pytest.approx(sum(s for s, _ in truth.values()))
    assert sum(totals[ONLOAD].values()) == pytest.approx(sum(o for _, o in truth.values()))
    assert set(totals[SAVED]) == set(totals[ONLOAD]) == set(net)
    # The fleet rule (one model) is the ranks' answers added up, read at its evaluation
    # (slack: the instance rule evaluated between them, its window one second longer).
    print(f"fleet rule {fleet!r}, the ranks' answers added up {summed!r}")
    assert fleet == pytest.approx(summed, rel=0.03)
