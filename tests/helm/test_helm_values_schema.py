"""values.schema.json rejects bad values with a message that names the key."""

from __future__ import annotations

import json
import re

import pytest
import yaml

from tests.helm.helm_render import CHART_DIR, HelmChart

BAD_VALUES = [
    # (helm flags, the key path helm must name, what is wrong)
    (["--set", "demo.replicas=two"], "/demo/replicas", "want integer"),
    (["--set", "monitor.enabled=yes"], "/monitor/enabled", "want boolean"),
    (["--set", "monitor.interval=15"], "/monitor/interval", "want string"),
    (["--set", "commonLabels.team=1"], "/commonLabels/team", "want string"),
    (["--set", "monitor.podMonitorPort=metrics"], "/monitor", "'podMonitorPort' not allowed"),
    (["--set", "demoo.enabled=true"], "at ''", "'demoo' not allowed"),
    (["--set", "demo.service.portt=80"], "/demo/service", "'portt' not allowed"),
    (["--set", "demo.port=-1"], "/demo/port", "minimum"),
    (["--set", "demo.service.port=0"], "/demo/service/port", "minimum"),
    (["--set", "demo.port=65536"], "/demo/port", "maximum"),
    (["--set", "monitor.kind=ProbeMonitor"], "/monitor/kind", "PodMonitor"),
    (["--set", "monitor.interval=15 s"], "/monitor/interval", "does not match pattern"),
    (["--set", "monitor.port=9464"], "/monitor/port", "want string"),
    (["--set", "monitor.path=metrics"], "/monitor/path", "does not match pattern"),
    (["--set", "demo.image.digest=latest"], "/demo/image/digest", "does not match pattern"),
    (["--set", "dashboards.label=grafana dashboard"], "/dashboards/label", "pattern"),
    (["--set", "monitor.selector.matchLabels=null"], "/monitor/selector", "minProperties"),
    (["--set", "monitor.selector=null"], "/monitor", "missing property 'selector'"),
    (["--set", "demo.resources.limits.memory=lots"], "/demo/resources/limits/memory", "pattern"),
]


@pytest.mark.parametrize(
    ("flags", "key", "problem"), BAD_VALUES, ids=[case[1] + ":" + case[2] for case in BAD_VALUES]
)
def test_bad_values_are_rejected_naming_the_key(
    chart: HelmChart, flags: list[str], key: str, problem: str
) -> None:
    stderr = chart.render_error(*flags)
    assert "values don't meet the specifications of the schema" in stderr
    assert f"at '{key}" in stderr or key in stderr, stderr
    assert problem in stderr, stderr


def test_schema_is_strict_on_every_chart_owned_object() -> None:
    """Every object the chart defines forbids unknown keys, so typos never pass silently."""
    schema = json.loads((CHART_DIR / "values.schema.json").read_text())
    loose: list[str] = []

    def walk(node: dict[str, object], path: str) -> None:
        properties = node.get("properties")
        if isinstance(properties, dict):
            if node.get("additionalProperties") is not False:
                loose.append(path or "/")
            for key, child in properties.items():
                if isinstance(child, dict):
                    walk(child, f"{path}/{key}")

    walk(schema, "")
    for name, definition in schema["definitions"].items():
        walk(definition, f"#/definitions/{name}")
    assert not loose, f"objects without additionalProperties: false: {loose}"


def test_values_yaml_documents_every_schema_option() -> None:
    """Each option the schema accepts has a default (and its comment) in values.yaml.

    Shared definitions (label selectors, namespace selectors) are documented in comments
    where their default is empty, so only inline objects with defaults are compared.
    """
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    schema = json.loads((CHART_DIR / "values.schema.json").read_text())

    def keys(node: object, schema_node: dict[str, object], path: str) -> list[str]:
        props = schema_node.get("properties")
        if not node or not isinstance(node, dict) or not isinstance(props, dict):
            return []
        missing = [f"{path}.{k}" for k in props if k not in node]
        for key, child in node.items():
            if key in props:
                missing += keys(child, props[key], f"{path}.{key}")
        return missing

    assert keys(values, schema, "") == []


def test_readme_names_only_real_values() -> None:
    """Every `a.b.c` value path the chart README mentions exists in values.yaml."""
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    readme = (CHART_DIR / "README.md").read_text()
    mentioned = set(re.findall(r"`([a-zA-Z]+(?:\.[a-zA-Z]+)+)[=`]", readme))
    paths = {p for p in mentioned if p.split(".")[0] in values}
    assert len(paths) >= 10, sorted(mentioned)
    for path in sorted(paths):
        node = values
        for part in path.split("."):
            assert isinstance(node, dict) and part in node, f"README names unknown value {path}"
            node = node[part]
