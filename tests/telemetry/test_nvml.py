"""NVML: real series when a GPU answers, one info line and no fake zeros when it does not."""

import types
from collections import namedtuple

import structlog
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from kvobs.recorder import Recorder
from kvobs.telemetry.nvml import NvmlSource, nvml_source, pcie_peak_bytes_per_second
from kvobs.telemetry.otel import OtelBridge


def test_pcie_peak_per_direction():
    assert pcie_peak_bytes_per_second(3, 16) == 15_753_846_153  # 8 GT/s, 128b/130b, x16
    assert pcie_peak_bytes_per_second(5, 16) == 63_015_384_615
    assert pcie_peak_bytes_per_second(4, 8) == pcie_peak_bytes_per_second(4, 16) // 2
    assert pcie_peak_bytes_per_second(99, 16) is None  # unknown: no series, not a 0
    assert pcie_peak_bytes_per_second(4, 0xFFFFFFFF) is None


def test_absent_nvml_logs_once_and_exports_nothing():
    with structlog.testing.capture_logs() as logs:
        source = nvml_source(structlog.get_logger("kvobs"))
    assert source is None  # no GPU and no nvidia-ml-py on this machine
    assert [e["event"] for e in logs] == ["nvml_unavailable"]
    assert logs[0]["log_level"] == "info"
    reader = InMemoryMetricReader()
    bridge = OtelBridge(Recorder(), [reader])
    data = reader.get_metrics_data()
    names = {m.name for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
    assert not {n for n in names if "gpu_memory" in n or "pcie" in n}
    bridge.shutdown()


class NVMLError_NotSupported(Exception):
    pass


def fake_nvml(devices):
    """The NVML library needs a GPU driver; this stands in for its Python binding only.

    A device is a dict: ``gen``/``width`` the current link, ``max_gen``/``max_width`` the
    maximum (default: the current one); a value that is an exception is raised.
    """
    memory = namedtuple("Memory", "total used free")
    calls = {"max": 0}

    def read(key, fallback=None):
        def get(d):
            if key.startswith("max"):
                calls["max"] += 1
            value = d.get(key, d.get(fallback)) if fallback else d[key]
            if isinstance(value, Exception):
                raise value
            return value

        return get

    return types.SimpleNamespace(
        calls=calls,
        nvmlDeviceGetCount=lambda: len(devices),
        nvmlDeviceGetHandleByIndex=lambda i: devices[i],
        nvmlDeviceGetMemoryInfo=lambda d: memory(d["total"], d["used"], d["total"] - d["used"]),
        nvmlDeviceGetCurrPcieLinkGeneration=read("gen"),
        nvmlDeviceGetCurrPcieLinkWidth=read("width"),
        nvmlDeviceGetMaxPcieLinkGeneration=read("max_gen", "gen"),
        nvmlDeviceGetMaxPcieLinkWidth=read("max_width", "width"),
    )


def by_device(series, name):
    return {labels["device"]: v for labels, v in series.get(name, [])}


def test_peak_uses_the_maximum_link_not_the_downshifted_one():
    # An idle H200 on a Gen5 x16 slot: the link rests at Gen1 and may narrow.
    idle = {"total": 141 * 2**30, "used": 0, "gen": 1, "width": 16, "max_gen": 5,
            "max_width": 16}
    nvml = fake_nvml([idle])
    source = NvmlSource(nvml)
    series = source()
    assert by_device(series, "kvobs_pcie_peak_bandwidth_bytes_per_second") == {
        "0": 63_015_384_615}
    assert by_device(series, "kvobs_pcie_link_generation") == {"0": 1}  # current, as named
    idle["gen"] = 5  # the GPU wakes up: the peak line does not move
    again = source()
    assert by_device(again, "kvobs_pcie_peak_bandwidth_bytes_per_second") == {"0": 63_015_384_615}
    assert by_device(again, "kvobs_pcie_link_generation") == {"0": 5}
    assert nvml.calls["max"] == 2  # the maximum is read once, then kept


def test_unknown_link_values_export_no_series():
    unknown_gen = {"total": 2**30, "used": 0, "gen": 7, "width": 16, "max_gen": 7}
    unsupported = {"total": 2**30, "used": 0, "gen": NVMLError_NotSupported(),
                   "width": NVMLError_NotSupported(), "max_gen": NVMLError_NotSupported(),
                   "max_width": NVMLError_NotSupported()}
    sentinel = {"total": 2**30, "used": 0, "gen": 4, "width": 0xFFFFFFFF,
                "max_width": 0xFFFFFFFF}
    series = NvmlSource(fake_nvml([unknown_gen, unsupported, sentinel]))()
    assert by_device(series, "kvobs_pcie_peak_bandwidth_bytes_per_second") == {}
    assert by_device(series, "kvobs_pcie_link_generation") == {"0": 7, "2": 4}
    assert by_device(series, "kvobs_pcie_link_width") == {"0": 16}
    assert set(by_device(series, "kvobs_gpu_memory_total_bytes")) == {"0", "1", "2"}


def test_source_reads_every_device():
    h200 = {"total": 141 * 2**30, "used": 100 * 2**30, "gen": 5, "width": 16}
    narrow = {"total": 80 * 2**30, "used": 0, "gen": 4, "width": 8}
    series = NvmlSource(fake_nvml([h200, narrow]))()
    assert series["kvobs_gpu_memory_total_bytes"] == [
        ({"device": "0"}, 141 * 2**30),
        ({"device": "1"}, 80 * 2**30),
    ]
    assert series["kvobs_gpu_memory_used_bytes"][0] == ({"device": "0"}, 100 * 2**30)
    assert series["kvobs_pcie_link_width"][1] == ({"device": "1"}, 8)
    peak = dict(
        (labels["device"], v) for labels, v in series["kvobs_pcie_peak_bandwidth_bytes_per_second"]
    )
    assert peak == {"0": 63_015_384_615, "1": pcie_peak_bytes_per_second(4, 8)}


def test_nvml_series_keep_their_catalog_names_on_metrics():
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from kvobs.telemetry.prometheus import start_metrics_server

    server = start_metrics_server("127.0.0.1:0")
    h100 = {"total": 80 * 2**30, "used": 2**30, "gen": 5, "width": 16}
    server.attach(Recorder(), sources=[NvmlSource(fake_nvml([h100]))])
    try:
        text = generate_latest(server.registry).decode()
    finally:
        server.close()
    names = {s.name for f in text_string_to_metric_families(text) for s in f.samples}
    assert {
        "kvobs_gpu_memory_total_bytes",
        "kvobs_gpu_memory_used_bytes",
        "kvobs_pcie_link_generation",
        "kvobs_pcie_link_width",
        "kvobs_pcie_peak_bandwidth_bytes_per_second",
    } <= names
