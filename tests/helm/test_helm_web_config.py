"""demo.webConfig: the web config Secret is mounted read-only and passed to the demo.

The pod stays non-root with a read-only root filesystem; probes check the TCP port
(an HTTP probe would get 401 or speak plain HTTP to TLS); the monitor carries the
scrape's TLS and basic-auth settings through to prometheus-operator.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helm.helm_render import VALUES_DIR, HelmChart, Manifest, one

WEB = ("--values", str(VALUES_DIR / "web-config.yaml"))


def demo_pod(docs: list[Manifest]) -> Manifest:
    pod: Manifest = one(docs, "Deployment")["spec"]["template"]["spec"]
    return pod


def test_without_a_secret_nothing_changes(chart: HelmChart) -> None:
    pod = demo_pod(chart.render("--set", "demo.enabled=true"))
    (container,) = pod["containers"]
    assert "--web-config-file" not in container["args"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/metrics"
    assert [v["name"] for v in pod["volumes"]] == ["tmp"]


def test_secret_is_mounted_read_only_and_passed_to_the_demo(chart: HelmChart) -> None:
    pod = demo_pod(chart.render(*WEB))
    (container,) = pod["containers"]
    args = container["args"]
    assert args[args.index("--web-config-file") + 1] == "/etc/kvobs/web/web-config.yml"
    assert {"name": "web-config", "mountPath": "/etc/kvobs/web", "readOnly": True} in \
        container["volumeMounts"]
    volume = next(v for v in pod["volumes"] if v["name"] == "web-config")
    assert volume["secret"] == {"secretName": "kvobs-web", "defaultMode": 0o440}
    # Group-readable: the non-root user reads it through the pod's fsGroup.
    assert pod["securityContext"]["fsGroup"] == pod["securityContext"]["runAsGroup"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["tcpSocket"] == {"port": "metrics"}
        assert "httpGet" not in container[probe]


def test_key_names_the_file_in_the_secret(chart: HelmChart) -> None:
    pod = demo_pod(chart.render(*WEB, "--set", "demo.webConfig.key=web.yaml"))
    assert "/etc/kvobs/web/web.yaml" in pod["containers"][0]["args"]


def test_monitor_scrapes_with_tls_and_basic_auth(chart: HelmChart) -> None:
    (endpoint,) = one(chart.render(*WEB, api=True), "PodMonitor")["spec"]["podMetricsEndpoints"]
    assert endpoint["scheme"] == "https"
    assert endpoint["tlsConfig"]["ca"] == {"secret": {"name": "kvobs-web", "key": "ca.crt"}}
    assert endpoint["basicAuth"]["password"] == {"name": "kvobs-scrape", "key": "password"}
    default = one(chart.render(api=True), "PodMonitor")["spec"]["podMetricsEndpoints"][0]
    assert "tlsConfig" not in default and "basicAuth" not in default


@pytest.mark.parametrize(("flag", "key", "problem"), [
    ("demo.webConfig.secretName=Kvobs_Web", "/demo/webConfig/secretName", "pattern"),
    ("demo.webConfig.key=etc/web.yml", "/demo/webConfig/key", "pattern"),
    ("demo.webConfig.file=x", "/demo/webConfig", "'file' not allowed"),
    ("monitor.tlsConfig=yes", "/monitor/tlsConfig", "want object"),
])
def test_bad_web_config_values_name_the_key(chart: HelmChart, flag: str, key: str,
                                            problem: str) -> None:
    stderr = chart.render_error("--set", flag)
    assert key in stderr and problem in stderr, stderr


def test_scenario_file_is_picked_up_by_every_render_check() -> None:
    assert (VALUES_DIR / "web-config.yaml") in sorted(Path(VALUES_DIR).glob("*.yaml"))
