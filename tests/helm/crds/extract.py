"""Extract the OpenAPI v3 schema of a prometheus-operator CRD into a JSON file.

The files next to this script come from the prometheus-operator repository at tag
v0.80.1 (the version of the cloudcoil models in kvobs[dev]), directory
``example/prometheus-operator-crd/``, one per custom resource the chart renders:

    git show v0.80.1:example/prometheus-operator-crd/monitoring.coreos.com_podmonitors.yaml \
        > podmonitors.yaml
    python tests/helm/crds/extract.py podmonitors.yaml tests/helm/crds/PodMonitor.v1.json

Only the served ``v1`` version's ``openAPIV3Schema`` is kept, without its
``description`` texts (the schema is the data; the prose stays upstream). Nothing else
is changed: ``test_helm_crd_openapi.py`` makes it strict (unknown fields refused, as an
API server with strict field validation does) when it loads it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import yaml


def strip_descriptions(node: Any) -> Any:
    """``node`` without any ``description`` key, at every depth."""
    if isinstance(node, dict):
        return {k: strip_descriptions(v) for k, v in node.items() if k != "description"}
    if isinstance(node, list):
        return [strip_descriptions(v) for v in node]
    return node


def extract(crd: dict[str, Any]) -> dict[str, Any]:
    """The served v1 schema of ``crd`` with its kind and group."""
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1" and v["served"]]
    return {
        "group": crd["spec"]["group"],
        "kind": crd["spec"]["names"]["kind"],
        "version": "v1",
        "operatorVersion": crd["metadata"]["annotations"]["operator.prometheus.io/version"],
        "openAPIV3Schema": strip_descriptions(version["schema"]["openAPIV3Schema"]),
    }


def main(source: str, dest: str) -> int:
    crd = yaml.safe_load(Path(source).read_text())
    Path(dest).write_text(json.dumps(extract(crd), indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
