"""examples/vllm-multiprocess-values.yaml: every engine of a DP x TP vLLM server is scraped.

vLLM's kvobs plugin serves one ``/metrics`` per engine (the engine core of data-parallel
rank ``r`` on ``PORT + r``) and, only with ``KVOBS_WORKER_METRICS=1``, one per GPU worker
``t`` on ``PORT + 100 + r * world_size + t``. The example names each port the plugin
serves and lists them in ``monitor.extraPorts``; the monitor rendered by ``helm template``
must have one endpoint per port, for a PodMonitor and for a ServiceMonitor, and pass the
prometheus-operator CRD schema (test_helm_crd_schemas runs every scenario, this example
included).
"""

from __future__ import annotations

import pytest

from kvobs.adapters._plugin import TRUE
from kvobs.adapters.vllm.plugin import WORKER_PORT_OFFSET
from tests.helm.helm_render import MULTIPROCESS_VALUES, HelmChart, Manifest, by_kind, one, selects
from tests.helm.test_helm_crd_schemas import crd_errors

ARGS = ("--values", str(MULTIPROCESS_VALUES))


def engine_container(docs: list[Manifest]) -> Manifest:
    (deployment,) = [d for d in by_kind(docs, "Deployment")
                     if d["metadata"]["name"].startswith("vllm")]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container


def arg(container: Manifest, flag: str) -> int:
    args = container["args"]
    return int(args[args.index(flag) + 1])


def plugin_ports(container: Manifest) -> set[int]:
    """The ports vLLM's kvobs plugin serves for this container's parallelism."""
    env = {item["name"]: item.get("value") for item in container["env"]}
    base = int(env["KVOBS_METRICS_ADDR"].rsplit(":", 1)[1])
    dp = arg(container, "--data-parallel-size")
    world = arg(container, "--tensor-parallel-size")  # pipeline parallel 1
    cores = {base + r for r in range(dp)}
    if env.get("KVOBS_WORKER_METRICS", "") not in TRUE:
        return cores
    workers = {base + WORKER_PORT_OFFSET + r * world + t for r in range(dp) for t in range(world)}
    return cores | workers


def test_pod_monitor_scrapes_every_engine_port(chart: HelmChart) -> None:
    docs = chart.render(*ARGS, api=True)
    monitor = one(docs, "PodMonitor")
    container = engine_container(docs)
    named = {p["name"]: p["containerPort"] for p in container["ports"]}
    scraped = [e["port"] for e in monitor["spec"]["podMetricsEndpoints"]]
    assert len(scraped) == len(set(scraped)) == 2  # one per engine (data-parallel rank)
    assert {named[name] for name in scraped} == plugin_ports(container)
    assert crd_errors(monitor) is None


def test_service_monitor_scrapes_every_engine_port(chart: HelmChart) -> None:
    docs = chart.render(*ARGS, "--set", "monitor.kind=ServiceMonitor", api=True)
    monitor = one(docs, "ServiceMonitor")
    (service,) = [s for s in by_kind(docs, "Service") if s["metadata"]["name"].startswith("vllm")]
    assert selects(monitor["spec"]["selector"], service["metadata"]["labels"])
    container = engine_container(docs)
    named = {p["name"]: p["containerPort"] for p in container["ports"]}
    targets = {p["name"]: named[p["targetPort"]] for p in service["spec"]["ports"]}
    scraped = {e["port"] for e in monitor["spec"]["endpoints"]}
    assert {targets[name] for name in scraped} == plugin_ports(container)
    assert crd_errors(monitor) is None


def test_extra_ports_default_to_one_endpoint(chart: HelmChart) -> None:
    monitor = one(chart.render(api=True), "PodMonitor")
    assert [e["port"] for e in monitor["spec"]["podMetricsEndpoints"]] == ["metrics"]


@pytest.mark.parametrize("bad", ["Metrics_1", "a-port-name-longer-than-15"])
def test_extra_ports_must_be_port_names(chart: HelmChart, bad: str) -> None:
    assert "extraPorts" in chart.render_error("--set", f"monitor.extraPorts={{{bad}}}")
