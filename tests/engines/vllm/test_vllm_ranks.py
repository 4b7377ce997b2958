"""Many engines, one scrape each: data-parallel engine cores in their own processes.

Each process is what vLLM's ``DPEngineCoreProc`` is for one rank: vLLM's plugin loader
with ``KVOBS_ENABLE=1`` and one shared ``KVOBS_METRICS_ADDR``, then a real ``Scheduler``
whose ``parallel_config.data_parallel_rank`` is the rank (as the engine core sets it),
driven through its own workload. The test scrapes every process's endpoint over HTTP
and checks that each one serves its own rank's figures, labelled with its ``dp_rank``,
on ``base port + rank``; a second engine of rank 0 on the same host moves to the next
free port.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.engines.vllm.test_vllm_plugin import scrape, value
from tests.engines.vllm032.engine_run import free_port

HERE = Path(__file__).parent

ENGINE = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    import vllm.plugins
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.structured_output import StructuredOutputManager
    from vllm_engine import EngineDriver, build_vllm_config, layer_specs, plan_kv_cache
    from kvobs.adapters.vllm import plugin

    rank, conversations, tmp = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
    vllm.plugins.load_general_plugins()              # kvobs comes in only through this
    config = build_vllm_config(tmp, cpu_bytes=1 << 20, max_model_len=63 * 16)
    config.parallel_config.data_parallel_rank = rank  # what DPEngineCoreProc sets
    kv_config = plan_kv_cache(config, layer_specs(), 64)
    config.cache_config.num_gpu_blocks = 64
    scheduler = Scheduler(config, kv_config, StructuredOutputManager(config),
                          block_size=16, log_stats=True)
    driver = EngineDriver(scheduler)
    for conv in range(conversations):
        driver.add(f"r{rank}-c{conv}", [rank * 10000 + conv * 100 + i for i in range(80)],
                   max_tokens=3)
    driver.run()
    print("KVOBS_RESULT " + json.dumps({
        "url": plugin.state().telemetry.metrics_url,
        "prefix_queries": driver.prefix_queries, "prefix_hits": driver.prefix_hits,
        "gpu_blocks": scheduler.kv_cache_manager.block_pool.num_gpu_blocks - 1,
        "gpu": driver.gpu_state(), "host_chunks": driver.offloading_manager._num_chunks,
    }), flush=True)
    sys.stdin.read()  # serve until the test has scraped
""")


def start_engine(rank: int, conversations: int, tmp: Path, base: int) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVOBS_")}
    env.update(KVOBS_ENABLE="1", KVOBS_METRICS_ADDR=f"127.0.0.1:{base}",
               KVOBS_SUMMARY_INTERVAL_S="0", KVOBS_MODEL="tiny-llama", HF_HUB_OFFLINE="1",
               PYTHONPATH=os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")]))
    tmp.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen([sys.executable, "-c", ENGINE, str(rank), str(conversations),
                             str(tmp)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, env=env)


def result_of(process: subprocess.Popen) -> dict:
    assert process.stdout is not None
    for line in process.stdout:
        if line.startswith("KVOBS_RESULT "):
            return json.loads(line.split(" ", 1)[1])
    raise AssertionError(f"engine exited ({process.wait()}) without a result")


def test_two_data_parallel_engines_one_scrape_each(tmp_path):
    base = free_port(1, 2, 3)  # four ranks' ports: base .. base + 3
    engines = {rank: start_engine(rank, conversations=2 + 3 * rank,
                                  tmp=tmp_path / f"rank{rank}", base=base)
               for rank in (0, 1)}
    try:
        results = {rank: result_of(p) for rank, p in engines.items()}
        # a second engine of rank 0 on this host (another `vllm serve`): next free port
        extra = start_engine(0, conversations=1, tmp=tmp_path / "extra", base=base)
        engines[2] = extra
        results[2] = result_of(extra)
        ports = {rank: int(r["url"].rsplit(":", 1)[1].split("/")[0])
                 for rank, r in results.items()}
        assert ports == {0: base, 1: base + 1, 2: base + 2}
        for key, truth in results.items():
            rank = 0 if key == 2 else key
            samples = scrape(truth["url"])
            ranks = {dict(labels).get("dp_rank") for name, labels in samples
                     if name.startswith("kvobs_")}
            assert ranks == {str(rank)}, f"engine {key} serves ranks {ranks}"
            assert value(samples, "kvobs_lookup_tokens_total") == truth["prefix_queries"]
            assert value(samples, "kvobs_lookup_tokens_total", outcome="gpu_hit") == \
                truth["prefix_hits"]
            assert value(samples, "kvobs_tier_capacity_blocks", tier="gpu") == \
                truth["gpu_blocks"]
            assert value(samples, "kvobs_tier_capacity_blocks", tier="host") == \
                truth["host_chunks"]
            in_use, cached = truth["gpu"]
            assert value(samples, "kvobs_tier_resident_blocks", tier="gpu",
                         state="cached") == cached
            assert value(samples, "kvobs_tier_resident_blocks", tier="gpu",
                         state="in_use") == in_use
        # each rank counted its own workload: rank 1 looked up more than rank 0
        assert results[1]["prefix_queries"] > results[0]["prefix_queries"] > 0
    finally:
        for process in engines.values():
            if process.stdin is not None:
                process.stdin.close()
        for process in engines.values():
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
