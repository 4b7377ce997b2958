"""examples/vllm-values.yaml: a vLLM Deployment running kvobs that the chart scrapes."""

from __future__ import annotations

import pytest

from tests.helm.helm_render import EXAMPLE_VALUES, HelmChart, Manifest, by_kind, one, selects

ARGS = ("--values", str(EXAMPLE_VALUES))


def vllm_deployment(docs: list[Manifest]) -> Manifest:
    (deployment,) = [
        d for d in by_kind(docs, "Deployment") if d["metadata"]["name"].startswith("vllm")
    ]
    return deployment


def test_vllm_pod_runs_the_kvobs_plugin_on_the_scraped_port(chart: HelmChart) -> None:
    docs = chart.render(*ARGS, api=True)
    monitor = one(docs, "PodMonitor")
    pod = vllm_deployment(docs)["spec"]["template"]
    assert selects(monitor["spec"]["selector"], pod["metadata"]["labels"])
    (container,) = pod["spec"]["containers"]
    env = {item["name"]: item.get("value") for item in container["env"]}
    assert env["KVOBS_ENABLE"] == "1"
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    # The monitor's named port is the one the plugin listens on.
    assert ports[endpoint["port"]] == int(env["KVOBS_METRICS_ADDR"].rsplit(":", 1)[1])
    assert endpoint["path"] == "/metrics"
    # The host tier is on, otherwise there is little for kvobs to show.
    assert "--kv-offloading-size" in container["args"]


def test_vllm_service_works_with_a_service_monitor(chart: HelmChart) -> None:
    docs = chart.render(*ARGS, "--set", "monitor.kind=ServiceMonitor", api=True)
    monitor = one(docs, "ServiceMonitor")
    (service,) = [s for s in by_kind(docs, "Service") if s["metadata"]["name"].startswith("vllm")]
    assert selects(monitor["spec"]["selector"], service["metadata"]["labels"])
    (endpoint,) = monitor["spec"]["endpoints"]
    (port,) = [p for p in service["spec"]["ports"] if p["name"] == endpoint["port"]]
    pod = vllm_deployment(docs)["spec"]["template"]
    assert selects({"matchLabels": service["spec"]["selector"]}, pod["metadata"]["labels"])
    container_ports = {p["name"] for p in pod["spec"]["containers"][0]["ports"]}
    assert port["targetPort"] in container_ports


@pytest.mark.parametrize("label", ["monitor", "rules"])
def test_example_labels_resources_for_kube_prometheus_stack(chart: HelmChart, label: str) -> None:
    kind = {"monitor": "PodMonitor", "rules": "PrometheusRule"}[label]
    resource = one(chart.render(*ARGS, api=True), kind)
    assert resource["metadata"]["labels"]["release"] == "kube-prometheus-stack"
