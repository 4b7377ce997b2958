"""The host pool's net benefit on a real Prometheus scraping the real multi-process engine.

vLLM's default multi-process engine (an engine-core and a worker process, kvobs in each
through vLLM's plugin loader, one ``/metrics`` endpoint per process) runs the chat
workload of ``engine_run.py`` with a configured prefill cost, while a real Prometheus
scrapes both endpoints every second with kvobs's shipped recording rules loaded. The
engine waits before its first request until Prometheus has scraped both endpoints (so
every counter's first sample is 0) and after its last until the test has read the rules.

Truth is vLLM's own registry: its external (host) prefix-cache hit tokens times the
configured cost is the saving, its ``vllm:kv_offload_load_time`` (one worker: nothing to
divide) the onload time. The rule's answer must be that saving minus that onload time,
for the one engine the two processes make.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.engines.vllm032.held_run import answer, final_net, held_engine, one, prometheus, query

#: Prefill seconds per token (configured): near what this run's host hits take to onload
#: per token on CPU (9.4e-7 to 8.5e-5 s measured, with the machine's speed and load), so
#: that neither side of the difference hides the other.
COST = 1e-5
#: How close the rule's answer must be to vLLM's figures (a scrape landing during the
#: rule's evaluation); each side of the difference must move the answer by 4x more.
TOLERANCE = 0.005


def test_net_benefit_is_vllms_saving_minus_its_onload_time(tmp_path: Path) -> None:
    with held_engine("engine_run.py", ["--mode", "multi"], tmp_path,
                     KVOBS_PREFILL_SECONDS_PER_TOKEN=repr(COST)) as engine:
        port = engine.ready()["kvobs_port"]
        core, worker = f"127.0.0.1:{port}", f"127.0.0.1:{port + 100}"  # kvobs's ports
        with prometheus(tmp_path, [core, worker]) as url:
            engine.wait("Prometheus to scrape both processes", lambda: True if answer(
                url, 'count(kvobs_lookups_total) == 2 and count(up == 1) == 2') else None,
                60)
            engine.go()
            at, net = final_net(url, engine, engine.done())
            saved_rate = one(url, f'rate(kvobs_prefill_saved_seconds_total{{tier="host",'
                                  f'instance="{core}"}}[5m])', at)
            saved = one(url, 'kvobs_prefill_saved_seconds_total{tier="host",'
                             f'instance="{core}"}}', at)
            onload = one(url, 'kvobs_transfer_seconds_total{src_tier="host",dst_tier="gpu"}',
                         at)
            sources = {r["metric"]["source"] for r in query(url, "kvobs_prefill_cost_info", at)}
    vllm = engine.vllm()

    # One engine, two processes, one answer: the engine core's, which counts both sides.
    # The worker exports a saving of 0 and no onload seconds (its link only times shards):
    # unknown there, so no sample (a rule reading a missing onload as 0 s answered 0).
    assert len(net) == 1 and net[0]["metric"]["instance"] == core
    assert sources == {"configured"}
    host_hit_tokens = vllm.total("vllm:external_prefix_cache_hits_total")
    load_s = vllm.total("vllm:kv_offload_load_time_total")
    assert saved == pytest.approx(host_hit_tokens * COST, rel=1e-9) and saved > 0
    assert onload == pytest.approx(load_s, rel=1e-9) and onload > 0
    # Both counters come from one scrape of one process, from 0: their rates over the
    # window are their totals times one factor, so the rule's answer is the saving's
    # rate times (1 - vLLM's onload time / vLLM's saving), both read at the instant the
    # rule was evaluated. Slack: a scrape landing during that evaluation.
    share = load_s / (host_hit_tokens * COST)
    # A rule that dropped the onload time would be off by share / |1 - share| of the
    # answer, one that dropped the saving by 1 / |1 - share|: inside these bounds, both by
    # more than 4x the tolerance.
    assert 4 * TOLERANCE < share < 1 / (4 * TOLERANCE), \
        f"both the saving and the onload time must show in the answer (onload / saving {share})"
    assert float(net[0]["value"][1]) == pytest.approx(saved_rate * (1 - share), rel=TOLERANCE)
