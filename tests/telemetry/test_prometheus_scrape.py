"""Start the exporter on port 0, scrape /metrics over real HTTP, check exact values."""

import urllib.request

import pytest
import structlog
from prometheus_client.parser import text_string_to_metric_families

from kvobs.catalog import METRICS
from kvobs.errors import ConfigError
from kvobs.exporter import Telemetry
from kvobs.recorder import Recorder
from kvobs.telemetry.prometheus import start_metrics_server
from tests.telemetry.scripted import scripted_recorder


def scrape(url):
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = {k: v for k, v in sample.labels.items() if k not in ("engine", "model")}
            samples[(sample.name, tuple(sorted(labels.items())))] = (sample.value, sample.labels)
    return samples


def value(samples, name, **labels):
    return samples[(name, tuple(sorted(labels.items())))][0]


@pytest.fixture
def telemetry():
    rec = scripted_recorder()
    with structlog.testing.capture_logs():
        started = Telemetry.start(
            rec, structlog.get_logger("kvobs"), metrics_addr="127.0.0.1:0", summary_interval_s=0,
            min_interval_s=0,  # each scrape below must see the events before it
        )
    yield rec, started
    started.close()


def test_exact_values_over_http(telemetry):
    _, started = telemetry
    s = scrape(started.metrics_url)
    assert value(s, "kvobs_tier_capacity_blocks", tier="gpu") == 100
    assert value(s, "kvobs_tier_capacity_tokens", tier="host") == 6400
    assert value(s, "kvobs_tier_capacity_bytes", tier="host") == 400 * 4096
    assert value(s, "kvobs_tier_resident_blocks", tier="gpu", state="in_use") == 7
    assert value(s, "kvobs_tier_resident_blocks", tier="gpu", state="cached") == 1
    assert value(s, "kvobs_tier_resident_blocks", tier="host", state="cached") == 1
    assert value(s, "kvobs_tier_resident_bytes", tier="gpu", state="in_use") == 7 * 4096
    assert value(s, "kvobs_block_allocations_total", tier="gpu") == 10
    assert value(s, "kvobs_block_frees_total", tier="gpu") == 4
    assert value(s, "kvobs_block_reuses_total", tier="gpu") == 1
    assert value(s, "kvobs_block_stores_total", tier="host") == 2
    assert value(s, "kvobs_block_evictions_total", tier="gpu", reason="capacity") == 2
    assert value(s, "kvobs_block_evictions_total", tier="host", reason="explicit") == 1
    assert value(s, "kvobs_lookups_total") == 2
    assert value(s, "kvobs_lookup_tokens_total", outcome="gpu_hit") == 64
    assert value(s, "kvobs_lookup_tokens_total", outcome="host_hit") == 32
    assert value(s, "kvobs_lookup_tokens_total", outcome="disk_hit") == 0
    assert value(s, "kvobs_lookup_tokens_total", outcome="miss") == 104
    up, down = {"src_tier": "gpu", "dst_tier": "host"}, {"src_tier": "host", "dst_tier": "gpu"}
    assert value(s, "kvobs_transfer_operations_total", **down) == 2
    assert value(s, "kvobs_transfer_blocks_total", **up) == 2
    assert value(s, "kvobs_transfer_bytes_total", **down) == 8192
    assert value(s, "kvobs_transfer_failures_total", **down) == 1
    assert value(s, "kvobs_transfer_drops_total", **up) == 3
    assert value(s, "kvobs_transfer_duration_seconds_count", **down) == 2
    assert value(s, "kvobs_transfer_duration_seconds_sum", **down) == pytest.approx(0.203)
    assert value(s, "kvobs_transfer_duration_seconds_bucket", **down, le="0.0025") == 0
    assert value(s, "kvobs_transfer_duration_seconds_bucket", **down, le="0.005") == 1
    assert value(s, "kvobs_transfer_duration_seconds_bucket", **down, le="0.25") == 2
    assert value(s, "kvobs_transfer_duration_seconds_bucket", **up, le="1e-05") == 0
    assert value(s, "kvobs_transfer_duration_seconds_bucket", **up, le="2.5e-05") == 1
    assert value(s, "kvobs_thrash_onloads_total") == 1
    assert value(s, "kvobs_offloaded_reused_blocks_total") == 1
    assert value(s, "kvobs_offloaded_evicted_unused_blocks_total") == 1
    labels = s[("kvobs_lookups_total", ())][1]
    assert (labels["engine"], labels["model"]) == ("scripted", "tiny")


def test_every_exported_name_is_in_the_catalog_and_counters_keep_growing(telemetry):
    rec, started = telemetry
    first = scrape(started.metrics_url)
    names = {spec.name for spec in METRICS}
    histogram_parts = {f"{n}{suffix}" for n in names for suffix in ("_bucket", "_count", "_sum")}
    exported = {name for name, _ in first if name.startswith("kvobs_")}
    assert exported <= names | histogram_parts
    nvml_only = {n for n in names if "gpu_memory" in n or "pcie" in n}
    only_when_known = {"kvobs_instrumentation_errors_total",  # after a failure
                       "kvobs_prefill_cost_relative_error",   # once a fit was made
                       # where the adapter tells preempted re-lookups apart (vLLM)
                       "kvobs_preempted_lookups_total", "kvobs_preempted_lookup_tokens_total",
                       # where the engine has hot buffers (vLLM HiSparse)
                       "kvobs_hot_buffer_lookups_total", "kvobs_hot_buffer_load_bytes_total",
                       # where an engine plugin says which release and parts it reads
                       "kvobs_engine_info", "kvobs_part_enabled",
                       # a timing-only link's (a vLLM worker's opt-in endpoint)
                       "kvobs_transfer_shard_duration_seconds"}
    assert (
        names - nvml_only - only_when_known
        <= {n.removesuffix("_count") for n in exported} | exported
    )
    rec.tier("gpu").allocate(5)
    rec.link("host", "gpu").transfer(1, 4096, 0.001)
    second = scrape(started.metrics_url)
    assert value(second, "kvobs_block_allocations_total", tier="gpu") == 15
    assert (
        value(second, "kvobs_transfer_duration_seconds_count", src_tier="host", dst_tier="gpu") == 3
    )
    for key, (old, _) in first.items():
        if key[0].endswith(("_total", "_count", "_bucket")):
            assert second[key][0] >= old


def test_port_in_use_is_a_clear_error():
    server = start_metrics_server("127.0.0.1:0")
    try:
        with pytest.raises(ConfigError, match=f"port {server.port} is already in use"):
            start_metrics_server(f"127.0.0.1:{server.port}")
    finally:
        server.close()


@pytest.mark.parametrize("address", ["9464", "localhost:", "host:99999", ":80"])
def test_malformed_address(address):
    with pytest.raises(ConfigError, match="--metrics-addr"):
        start_metrics_server(address)


def test_taken_port_moves_to_the_next_free_one_and_the_url_says_which():
    taken = start_metrics_server("127.0.0.1:0")
    rec = Recorder(engine="vllm", labels={"dp_rank": "1"})
    rec.add_tier("gpu", capacity_blocks=8, block_tokens=16, block_bytes=1024)
    try:
        with structlog.testing.capture_logs() as logs:
            telemetry = Telemetry.start(rec, structlog.get_logger("kvobs"),
                                        metrics_addr=f"127.0.0.1:{taken.port}",
                                        summary_interval_s=0, port_attempts=16, nvml=False)
        try:
            assert telemetry.server is not None and telemetry.server.port != taken.port
            serving = [e for e in logs if e["event"] == "metrics_serving"]
            assert serving and serving[0]["url"] == telemetry.metrics_url
            assert serving[0]["dp_rank"] == "1"
            assert value(scrape(telemetry.metrics_url), "kvobs_tier_capacity_blocks",
                         tier="gpu", dp_rank="1") == 8
        finally:
            telemetry.close()
    finally:
        taken.close()


def test_port_attempts_one_keeps_the_clear_error():
    taken = start_metrics_server("127.0.0.1:0")
    try:
        with pytest.raises(ConfigError, match="already in use"):
            Telemetry.start(Recorder(), structlog.get_logger("kvobs"),
                            metrics_addr=f"127.0.0.1:{taken.port}", summary_interval_s=0)
    finally:
        taken.close()
