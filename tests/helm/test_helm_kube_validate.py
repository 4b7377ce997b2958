"""Rendered core resources validate strictly against Kubernetes 1.29 and 1.33 schemas.

kubernetes-validate carries the upstream OpenAPI schemas; --strict (strict=True) rejects
unknown fields. It has no schema for custom resources (they are checked in
test_helm_crd_schemas.py), so those are routed away here rather than silently passed.
"""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import pytest

from tests.helm.helm_render import SCENARIOS, HelmChart, Manifest, scenario_args, scenario_id

KUBE_VERSIONS = ["1.29.0", "1.33.0"]
CUSTOM_GROUPS = ("monitoring.coreos.com/",)


def core_manifests(docs: list[Manifest]) -> list[Manifest]:
    return [doc for doc in docs if not doc["apiVersion"].startswith(CUSTOM_GROUPS)]


def validation_errors(doc: Manifest, kube_version: str) -> str | None:
    try:
        kubernetes_validate.validate(doc, kube_version, strict=True)
    except kubernetes_validate.ValidationError as error:
        path = ".".join(str(part) for part in error.path)
        return f"{doc['kind']}/{doc['metadata']['name']}: {path}: {error.message}"
    return None


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
@pytest.mark.parametrize("values", SCENARIOS, ids=scenario_id)
def test_core_resources_validate_strictly(
    chart: HelmChart, values: Path | None, kube_version: str
) -> None:
    args = (*scenario_args(values), "--set", "demo.enabled=true")
    docs = core_manifests(chart.render(*args, api=True, kube_version=kube_version))
    assert docs, "every scenario renders core resources"
    errors = [e for doc in docs if (e := validation_errors(doc, kube_version))]
    assert not errors, "\n".join(errors)


def test_demo_with_network_policy_validates(chart: HelmChart) -> None:
    docs = core_manifests(
        chart.render("--set", "demo.enabled=true", "--set", "demo.networkPolicy.enabled=true")
    )
    assert {doc["kind"] for doc in docs} >= {"Deployment", "Service", "NetworkPolicy"}
    for kube_version in KUBE_VERSIONS:
        errors = [e for doc in docs if (e := validation_errors(doc, kube_version))]
        assert not errors, "\n".join(errors)


def test_strict_validation_catches_a_misplaced_field(chart: HelmChart) -> None:
    """The validator is not a rubber stamp: one misspelt field fails the Deployment."""
    deployment = next(
        doc for doc in chart.render("--set", "demo.enabled=true") if doc["kind"] == "Deployment"
    )
    broken = copy.deepcopy(deployment)
    broken["spec"]["template"]["spec"]["containers"][0]["securityContxt"] = {}
    assert validation_errors(deployment, "1.33.0") is None
    error = validation_errors(broken, "1.33.0")
    assert error is not None and "securityContxt" in error


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_kubernetes_validate_cli_on_the_rendered_stream(
    chart: HelmChart, kube_version: str, tmp_path: Path
) -> None:
    """The CLI users run in their pipelines: passes every core resource, skips the CRs."""
    rendered = tmp_path / "kvobs.yaml"
    rendered.write_text(
        chart.render_text("--set", "demo.enabled=true", api=True, kube_version=kube_version)
    )
    cli = Path(sys.executable).parent / "kubernetes-validate"
    done = subprocess.run(
        [str(cli), "--strict", "-k", kube_version, str(rendered)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    passed = [line for line in done.stdout.splitlines() if " passed for resource " in line]
    assert len(passed) == len(core_manifests(chart.render("--set", "demo.enabled=true", api=True)))
    # Why the CRD schema tests exist: the CLI only warns about custom resources.
    assert "Couldn't find schema for kind PodMonitor" in done.stdout
