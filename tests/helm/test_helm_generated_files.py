"""Dashboards and rules reach the cluster exactly as `kvobs dashboards` generates them.

The chart's files/ are copies of dashboards/generated/ and dashboards/rules/; the
generator's own test checks the copies. These tests check the other half: every copy
is rendered (counted, byte for byte), labelled for the Grafana sidecar, and wrapped into
one PrometheusRule without losing or changing a rule.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.helm.helm_render import REPO, HelmChart, Manifest, by_kind, one

SOURCES = {"dashboards": REPO / "dashboards" / "generated", "rules": REPO / "dashboards" / "rules"}
CONFIGMAP_LIMIT = 1024 * 1024


def dashboard_configmaps(docs: list[Manifest]) -> dict[str, Manifest]:
    """Data key (the dashboard file name) -> its ConfigMap."""
    found = {}
    for doc in by_kind(docs, "ConfigMap"):
        (key,) = doc["data"]
        found[key] = doc
    return found


def rule_groups(paths: list[Path]) -> list[Manifest]:
    return [group for path in paths for group in yaml.safe_load(path.read_text())["groups"]]


def test_chart_copies_match_the_generated_sources(
    generated_files: dict[str, list[Path]],
) -> None:
    for kind, paths in generated_files.items():
        for path in paths:
            source = SOURCES[kind] / path.name
            if not source.is_file():
                pytest.skip(f"{source} is not in this checkout (packaged chart?)")
            assert path.read_bytes() == source.read_bytes(), (
                f"{path} drifted from {source}; run `kvobs dashboards`"
            )


def test_one_configmap_per_dashboard_byte_for_byte(
    chart: HelmChart, generated_files: dict[str, list[Path]]
) -> None:
    configmaps = dashboard_configmaps(chart.render())
    assert sorted(configmaps) == [path.name for path in generated_files["dashboards"]]
    for path in generated_files["dashboards"]:
        text = configmaps[path.name]["data"][path.name]
        assert text == path.read_text(encoding="utf-8")
        assert json.loads(text)["uid"], f"{path.name} has no uid for Grafana to key it by"
        assert len(json.dumps(configmaps[path.name]).encode()) < CONFIGMAP_LIMIT


def test_configmaps_are_labelled_for_the_grafana_sidecar(chart: HelmChart) -> None:
    for configmap in dashboard_configmaps(chart.render()).values():
        metadata = configmap["metadata"]
        assert metadata["labels"]["grafana_dashboard"] == "1"
        assert metadata["annotations"] == {"grafana_folder": "kvobs"}
        assert metadata["namespace"] == "kvobs"


def test_sidecar_label_folder_and_namespace_are_configurable(chart: HelmChart) -> None:
    docs = chart.render(
        "--set", "dashboards.label=example.com/dashboard",
        "--set", "dashboards.labelValue=kv",
        "--set", "dashboards.folderAnnotation=k8s-sidecar-target-directory",
        "--set", "dashboards.folder=/tmp/dashboards/kvobs",
        "--set", "dashboards.namespace=grafana",
    )  # fmt: skip
    for configmap in dashboard_configmaps(docs).values():
        metadata = configmap["metadata"]
        assert metadata["labels"]["example.com/dashboard"] == "kv"
        assert "grafana_dashboard" not in metadata["labels"]
        assert metadata["annotations"] == {"k8s-sidecar-target-directory": "/tmp/dashboards/kvobs"}
        assert metadata["namespace"] == "grafana"
    no_folder = chart.render("--set", "dashboards.folderAnnotation=")
    assert all("annotations" not in c["metadata"] for c in by_kind(no_folder, "ConfigMap"))
    assert not by_kind(chart.render("--set", "dashboards.enabled=false"), "ConfigMap")


def test_prometheus_rule_holds_every_generated_group_unchanged(
    chart: HelmChart, generated_files: dict[str, list[Path]]
) -> None:
    rule = one(chart.render(api=True), "PrometheusRule")
    assert rule["spec"]["groups"] == rule_groups(generated_files["rules"])
    rules = [r for group in rule["spec"]["groups"] for r in group["rules"]]
    assert any("record" in r for r in rules) and any("alert" in r for r in rules)


def test_rule_toggles_and_alert_labels(
    chart: HelmChart, generated_files: dict[str, list[Path]]
) -> None:
    generated = rule_groups(generated_files["rules"])
    alerts = {r["alert"]: r for g in generated for r in g["rules"] if "alert" in r}
    docs = chart.render(
        "--set", "rules.recording=false",
        "--set", "rules.alertLabels.team=inference",
        "--set", "rules.alertLabels.severity=page",
        "--set", "rules.labels.release=kube-prometheus-stack",
        api=True,
    )  # fmt: skip
    rule = one(docs, "PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    kept = [r for group in rule["spec"]["groups"] for r in group["rules"]]
    assert sorted(r["alert"] for r in kept) == sorted(alerts)
    for alert in kept:
        own = alerts[alert["alert"]].get("labels", {})
        # Added to every alert; a label the alert sets itself (severity) keeps its value.
        assert alert["labels"] == {"team": "inference", "severity": "page", **own}
        assert {k: v for k, v in alert.items() if k != "labels"} == {
            k: v for k, v in alerts[alert["alert"]].items() if k != "labels"
        }

    recording_only = one(chart.render("--set", "rules.alerting=false", api=True), "PrometheusRule")
    kept = [r for group in recording_only["spec"]["groups"] for r in group["rules"]]
    assert kept and all("record" in r for r in kept)
    off = ("--set", "rules.alerting=false", "--set", "rules.recording=false")
    neither = chart.render(*off, api=True)
    assert not by_kind(neither, "PrometheusRule")
