"""What `helm template` renders: the API gate, the monitor, the demo and its security, the
fleet aggregator."""

from __future__ import annotations

import json

import pytest

from tests.helm.helm_render import MONITORING_API, HelmChart, Manifest, by_kind, one, selects

MONITORING_KINDS = {"PodMonitor", "ServiceMonitor", "PrometheusRule"}


def kinds(docs: list[Manifest]) -> set[str]:
    return {doc["kind"] for doc in docs}


def test_custom_resources_need_the_monitoring_api(chart: HelmChart) -> None:
    without = chart.render()
    assert not kinds(without) & MONITORING_KINDS
    assert by_kind(without, "ConfigMap"), "dashboards render with or without the operator"
    assert kinds(chart.render(api=True)) >= {"PodMonitor", "PrometheusRule"}
    assert kinds(chart.render("--set", "prometheusOperator.force=true")) >= {
        "PodMonitor",
        "PrometheusRule",
    }


def test_notes_say_what_was_skipped_and_installed(chart: HelmChart) -> None:
    skipped = chart.notes()
    assert "SKIPPED" in skipped and MONITORING_API in skipped
    assert "grafana_dashboard" in skipped
    forced = chart.notes("--set", "prometheusOperator.force=true", "--set", "demo.enabled=true")
    assert "SKIPPED" not in forced
    assert 'PodMonitor kvobs scrapes port "metrics" path /metrics' in forced
    assert "port-forward svc/kvobs-demo 9464:9464" in forced


@pytest.mark.parametrize("kind", ["PodMonitor", "ServiceMonitor"])
def test_monitor_scrapes_the_demo_by_selector_port_and_path(chart: HelmChart, kind: str) -> None:
    docs = chart.render("--set", f"monitor.kind={kind}", "--set", "demo.enabled=true", api=True)
    monitor = one(docs, kind)
    assert not by_kind(docs, ({"PodMonitor", "ServiceMonitor"} - {kind}).pop())
    spec = monitor["spec"]
    endpoints = spec["podMetricsEndpoints" if kind == "PodMonitor" else "endpoints"]
    assert [(e["port"], e["path"], e["interval"]) for e in endpoints] == [
        ("metrics", "/metrics", "15s")
    ]
    if kind == "PodMonitor":
        pod = one(docs, "Deployment")["spec"]["template"]
        assert selects(spec["selector"], pod["metadata"]["labels"])
        ports = pod["spec"]["containers"][0]["ports"]
    else:
        service = one(docs, "Service")
        assert selects(spec["selector"], service["metadata"]["labels"])
        ports = service["spec"]["ports"]
    assert "metrics" in {port["name"] for port in ports}


def test_monitor_options_pass_through(chart: HelmChart) -> None:
    docs = chart.render(
        "--set", "monitor.labels.release=kube-prometheus-stack",
        "--set-json", 'monitor.namespaceSelector={"matchNames":["inference"]}',
        "--set-json", 'monitor.relabelings=[{"targetLabel":"cluster","replacement":"a"}]',
        "--set", "monitor.scrapeTimeout=5s",
        api=True,
    )  # fmt: skip
    monitor = one(docs, "PodMonitor")
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["inference"]}
    endpoint = monitor["spec"]["podMetricsEndpoints"][0]
    assert endpoint["relabelings"] == [{"targetLabel": "cluster", "replacement": "a"}]
    assert endpoint["scrapeTimeout"] == "5s"


def test_monitor_disabled_renders_none(chart: HelmChart) -> None:
    docs = chart.render("--set", "monitor.enabled=false", api=True)
    assert not kinds(docs) & {"PodMonitor", "ServiceMonitor"}


def test_demo_is_optional_and_locked_down(chart: HelmChart) -> None:
    assert not by_kind(chart.render(), "Deployment")
    docs = chart.render("--set", "demo.enabled=true")
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (container,) = pod["containers"]
    assert container["args"] == ["demo", "--metrics-addr", "0.0.0.0:9464"]
    assert container["ports"] == [{"name": "metrics", "containerPort": 9464, "protocol": "TCP"}]
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert set(container["resources"]) == {"requests", "limits"}
    assert set(container["resources"]["limits"]) == {"cpu", "memory"}
    # The read-only root needs a writable /tmp (HOME points there).
    assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
    assert not by_kind(docs, "NetworkPolicy")


def test_demo_port_args_and_image_digest_follow_values(chart: HelmChart) -> None:
    docs = chart.render(
        "--set", "demo.enabled=true", "--set", "demo.port=9500",
        "--set-json", 'demo.args=["--rate","8"]',
        "--set", "demo.image.digest=sha256:" + "ab" * 32,
    )  # fmt: skip
    (container,) = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert container["args"] == ["demo", "--metrics-addr", "0.0.0.0:9500", "--rate", "8"]
    assert container["ports"][0]["containerPort"] == 9500
    assert container["image"] == "kvobs@sha256:" + "ab" * 32


def test_network_policy_admits_only_the_metrics_port(chart: HelmChart) -> None:
    docs = chart.render("--set", "demo.enabled=true", "--set", "demo.networkPolicy.enabled=true")
    policy = one(docs, "NetworkPolicy")["spec"]
    pod_labels = one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert selects(policy["podSelector"], pod_labels)
    assert policy["policyTypes"] == ["Ingress", "Egress"]
    assert policy["ingress"] == [{"ports": [{"port": "metrics", "protocol": "TCP"}]}]
    assert policy["egress"] == []


def test_common_labels_and_fullname_override_reach_every_resource(chart: HelmChart) -> None:
    docs = chart.render(
        "--set", "commonLabels.environment=staging", "--set", "fullnameOverride=kvo",
        "--set", "demo.enabled=true", "--set", "demo.networkPolicy.enabled=true",
        api=True,
    )  # fmt: skip
    assert len(docs) >= 7
    for doc in docs:
        metadata = doc["metadata"]
        assert metadata["labels"]["environment"] == "staging", doc["kind"]
        assert metadata["name"].startswith("kvo"), metadata["name"]
        assert metadata["namespace"] == "kvobs"


def test_the_fleet_aggregator_follows_the_engines_and_is_scraped(chart: HelmChart) -> None:
    engines = ["a=tcp://vllm-0.vllm:5557,replay=tcp://vllm-0.vllm:5558", "tcp://vllm-1.vllm:5557"]
    docs = chart.render("--set", "fleet.enabled=true", "--set", "fleet.model=m",
                        "--set-json", f"fleet.engines={json.dumps(engines)}",
                        "--set", "fleet.sampleRate=1/16", api=True)
    fleet = one(docs, "Deployment")
    pod = fleet["spec"]["template"]
    [container] = pod["spec"]["containers"]
    assert container["args"] == ["fleet", "--metrics-addr", "0.0.0.0:9465", "--model", "m",
                                 "--sample-rate", "1/16", "--engine", engines[0],
                                 "--engine", engines[1]]
    assert fleet["spec"]["replicas"] == 1
    monitor = one(docs, "PodMonitor")
    assert selects(monitor["spec"]["selector"], pod["metadata"]["labels"])
    assert {p["name"] for p in container["ports"]} == {"metrics"}


def test_the_fleet_without_engines_says_what_to_list(chart: HelmChart) -> None:
    error = chart.render_error("--set", "fleet.enabled=true")
    assert "fleet.engines is empty" in error and "tcp://" in error
