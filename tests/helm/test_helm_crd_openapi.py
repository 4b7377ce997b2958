"""The chart's custom resources validate against the prometheus-operator CRDs' own schemas.

``crds/*.v1.json`` hold the ``openAPIV3Schema`` of the PodMonitor, ServiceMonitor and
PrometheusRule CRDs of prometheus-operator v0.80.1, extracted from its repository by
``crds/extract.py`` (descriptions left out). Loaded here the way an API server with
strict field validation applies them: an unknown field anywhere is an error (the API
server would drop or refuse it), ``x-kubernetes-int-or-string`` takes an integer or a
string, everything else (types, enums, patterns, required fields, bounds) as written.
test_helm_crd_schemas.py checks the same manifests with the cloudcoil models; this is the
CRD itself, so a model generator's loss cannot hide a mistake.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from tests.helm.helm_render import SCENARIOS, HelmChart, Manifest, scenario_args, scenario_id

CRDS = Path(__file__).resolve().parent / "crds"


def strict(node: Any) -> Any:
    """The structural schema as a strict API server reads it, in JSON Schema terms."""
    if isinstance(node, list):
        return [strict(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: strict(v) for k, v in node.items() if not k.startswith("x-kubernetes-")}
    if node.get("x-kubernetes-int-or-string"):
        out.setdefault("type", ["integer", "string"])
    if ("properties" in node and "additionalProperties" not in node
            and not node.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out


def validator(kind: str) -> jsonschema.protocols.Validator:
    crd = json.loads((CRDS / f"{kind}.v1.json").read_text())
    assert crd["group"] == "monitoring.coreos.com" and crd["kind"] == kind
    schema = strict(crd["openAPIV3Schema"])
    return jsonschema.Draft7Validator(schema)


VALIDATORS = {kind: validator(kind) for kind in ("PodMonitor", "ServiceMonitor",
                                                 "PrometheusRule")}


def errors(doc: Manifest) -> list[str]:
    found = VALIDATORS[doc["kind"]].iter_errors(doc)
    return [f"{doc['kind']}/{doc['metadata']['name']} at "
            f"{'/'.join(map(str, e.absolute_path)) or '/'}: {e.message}" for e in found]


@pytest.mark.parametrize("kind", ["PodMonitor", "ServiceMonitor"])
@pytest.mark.parametrize("values", SCENARIOS, ids=scenario_id)
def test_custom_resources_match_the_crd_openapi_schema(
    chart: HelmChart, values: Path | None, kind: str
) -> None:
    docs = [doc for doc in chart.render(*scenario_args(values), "--set",
                                        f"monitor.kind={kind}", api=True)
            if doc["apiVersion"] == "monitoring.coreos.com/v1"]
    assert {doc["kind"] for doc in docs} <= set(VALIDATORS)
    assert kind in {doc["kind"] for doc in docs} or scenario_id(values) in (
        "dashboards-only", "forced-alerts-only")
    problems = [line for doc in docs for line in errors(doc)]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(("change", "field"), [
    (lambda ep: ep.update(scheme="ftp"), "scheme"),          # enum http / https
    (lambda ep: ep.update(interval="15 seconds"), "interval"),  # a Prometheus duration
    (lambda ep: ep.update(portRange="9464-9470"), "portRange"),  # no such field
])
def test_the_schema_refuses_what_an_operator_refuses(chart: HelmChart, change: Any,
                                                     field: str) -> None:
    (monitor,) = [d for d in chart.render(api=True) if d["kind"] == "PodMonitor"]
    change(monitor["spec"]["podMetricsEndpoints"][0])
    assert any(field in line for line in errors(monitor)), errors(monitor)
