"""PodMonitor, ServiceMonitor and PrometheusRule validate against the operator's schemas.

The schemas are the pydantic models of cloudcoil-models-prometheus-operator (generated
from the prometheus-operator CRDs, version pinned in pyproject's dev extra). Validation
forbids unknown keys at every level and coerces no types, like a strict API server.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pydantic
import pytest
from cloudcoil.models.prometheus_operator import v1 as operator

from tests.helm.helm_render import SCENARIOS, HelmChart, Manifest, one, scenario_args, scenario_id

MODELS: dict[str, type[pydantic.BaseModel]] = {
    "PodMonitor": operator.PodMonitor,
    "ServiceMonitor": operator.ServiceMonitor,
    "PrometheusRule": operator.PrometheusRule,
}


def crd_errors(doc: Manifest) -> str | None:
    try:
        MODELS[doc["kind"]].model_validate(doc, strict=True, extra="forbid")
    except pydantic.ValidationError as error:
        return f"{doc['kind']}/{doc['metadata']['name']}: {error}"
    return None


def custom_resources(docs: list[Manifest]) -> list[Manifest]:
    return [doc for doc in docs if doc["apiVersion"] == "monitoring.coreos.com/v1"]


@pytest.mark.parametrize("kind", ["PodMonitor", "ServiceMonitor"])
@pytest.mark.parametrize("values", SCENARIOS, ids=scenario_id)
def test_custom_resources_match_their_crd_schema(
    chart: HelmChart, values: Path | None, kind: str
) -> None:
    docs = custom_resources(
        chart.render(*scenario_args(values), "--set", f"monitor.kind={kind}", api=True)
    )
    unknown = {doc["kind"] for doc in docs} - set(MODELS)
    assert not unknown, f"no schema for {unknown}"
    errors = [e for doc in docs if (e := crd_errors(doc))]
    assert not errors, "\n".join(errors)


def test_every_scenario_renders_some_custom_resource(chart: HelmChart) -> None:
    rendered = {
        scenario_id(values): {
            doc["kind"] for doc in custom_resources(chart.render(*scenario_args(values), api=True))
        }
        for values in SCENARIOS
    }
    assert rendered["defaults"] == {"PodMonitor", "PrometheusRule"}
    assert rendered["servicemonitor"] == {"ServiceMonitor", "PrometheusRule"}
    assert rendered["dashboards-only"] == set()


@pytest.mark.parametrize(
    ("path", "value", "complaint"),
    [
        (("spec", "podMetricsEndpoints", 0, "intervall"), "15s", "Extra inputs"),
        (("spec", "podMetricsEndpoints", 0, "interval"), "15 s", "should match pattern"),
        (("spec", "podMetricsEndpoints", 0, "honorLabels"), "true", "valid boolean"),
        (("spec", "selector", "matchLabel"), {"a": "b"}, "Extra inputs"),
    ],
)
def test_schema_check_catches_broken_monitors(
    chart: HelmChart, path: tuple[str | int, ...], value: object, complaint: str
) -> None:
    monitor = one(chart.render(api=True), "PodMonitor")
    assert crd_errors(monitor) is None
    broken = copy.deepcopy(monitor)
    node: Any = broken
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    error = crd_errors(broken)
    assert error is not None and complaint in error, error
