"""Run the real helm binary on helm/kvobs and hand back parsed manifests.

Example:
    chart = HelmChart(helm=Path(".tools/bin/helm"), chart_dir=CHART_DIR)
    docs = chart.render("--set", "demo.enabled=true", api=True)
    kinds = [doc["kind"] for doc in docs]
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from tests import required

REPO = Path(__file__).resolve().parents[2]
# KVOBS_CHART_DIR points the tests at another copy of the chart (e.g. an unpacked package).
CHART_DIR = Path(os.environ.get("KVOBS_CHART_DIR", REPO / "helm" / "kvobs"))
VALUES_DIR = Path(__file__).resolve().parent / "values"
EXAMPLE_VALUES = CHART_DIR / "examples" / "vllm-values.yaml"
MULTIPROCESS_VALUES = CHART_DIR / "examples" / "vllm-multiprocess-values.yaml"
MONITORING_API = "monitoring.coreos.com/v1"
Manifest = dict[str, Any]

# Values files every render-level test runs through: the defaults, each scenario under
# values/, and the vLLM examples users copy.
SCENARIOS: list[Path | None] = [
    None, *sorted(VALUES_DIR.glob("*.yaml")), EXAMPLE_VALUES, MULTIPROCESS_VALUES,
]


def scenario_id(path: Path | None) -> str:
    return "defaults" if path is None else path.stem


def scenario_args(path: Path | None) -> tuple[str, ...]:
    return () if path is None else ("--values", str(path))


def find_tool(name: str) -> Path:
    """The binary from $REPO/.tools/bin or PATH; skips the test, or fails it when CI is set."""
    return required.find_tool(name, "scripts/deps/helm.sh")


def dockerfile_instructions(name: str) -> list[str]:
    """Arguments of every ``name`` instruction of the Dockerfile (continuations joined)."""
    text = re.sub(r"\\\n", " ", (REPO / "Dockerfile").read_text())
    return [line.split(None, 1)[1] for line in text.splitlines() if line.startswith(name + " ")]


def dockerfile_arg(name: str) -> str:
    """The default value of build argument ``name``."""
    for arg in dockerfile_instructions("ARG"):
        key, _, value = arg.partition("=")
        if key == name:
            return value.strip('"')
    raise AssertionError(f"the Dockerfile has no ARG {name}")


def load_manifests(text: str) -> list[Manifest]:
    """Every non-empty YAML document of a rendered stream."""
    return [doc for doc in yaml.safe_load_all(text) if doc]


def by_kind(docs: Iterable[Manifest], kind: str) -> list[Manifest]:
    return [doc for doc in docs if doc["kind"] == kind]


def one(docs: Iterable[Manifest], kind: str) -> Manifest:
    """The single manifest of ``kind``; fails the test when there are none or several."""
    found = by_kind(docs, kind)
    assert len(found) == 1, f"expected one {kind}, rendered {len(found)}"
    return found[0]


def selects(selector: Manifest, labels: dict[str, str]) -> bool:
    """Kubernetes LabelSelector semantics (matchLabels and matchExpressions)."""
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for expression in selector.get("matchExpressions", []):
        key, operator = expression["key"], expression["operator"]
        values = expression.get("values", [])
        ok = {
            "In": key in labels and labels[key] in values,
            "NotIn": key not in labels or labels[key] not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[operator]
        if not ok:
            return False
    return True


class HelmError(AssertionError):
    """helm exited non-zero; the message carries its stderr."""


class HelmChart:
    """helm/kvobs driven through the real helm CLI; renders are cached per argument list.

    Args:
        helm: path of the helm v4 binary.
        chart_dir: the chart directory.
    """

    def __init__(self, helm: Path, chart_dir: Path = CHART_DIR) -> None:
        self.helm = helm
        self.chart_dir = chart_dir

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "HELM_CACHE_HOME": "/tmp/kvobs-helm-cache"}
        env.pop("KUBECONFIG", None)
        return subprocess.run(
            [str(self.helm), *args], capture_output=True, text=True, timeout=60, env=env
        )

    def render_text(self, *args: str, api: bool = False, kube_version: str | None = None) -> str:
        """``helm template`` output; ``api`` announces the prometheus-operator API."""
        return self._render_cached(tuple(args), api, kube_version)

    def render(
        self, *args: str, api: bool = False, kube_version: str | None = None
    ) -> list[Manifest]:
        """Parsed ``helm template`` manifests (fresh copies: callers may mutate them)."""
        return load_manifests(self.render_text(*args, api=api, kube_version=kube_version))

    def render_error(self, *args: str) -> str:
        """stderr of a ``helm template`` that must fail; fails the test if it renders."""
        done = self.run("template", "kvobs", str(self.chart_dir), *args)
        assert done.returncode != 0, f"helm template {' '.join(args)} unexpectedly rendered"
        return done.stderr

    def notes(self, *args: str) -> str:
        """NOTES.txt as ``helm install --dry-run=client`` prints it (no cluster needed)."""
        done = self.run("install", "kvobs", str(self.chart_dir), "--dry-run=client", *args)
        if done.returncode != 0:
            raise HelmError(done.stderr)
        return done.stdout.split("NOTES:\n", 1)[1]

    @functools.lru_cache(maxsize=128)  # noqa: B019 - one instance per session
    def _render_cached(self, args: tuple[str, ...], api: bool, kube_version: str | None) -> str:
        flags = list(args)
        if api:
            flags += ["--api-versions", MONITORING_API]
        if kube_version:
            flags += ["--kube-version", kube_version]
        done = self.run("template", "kvobs", str(self.chart_dir), "--namespace", "kvobs", *flags)
        if done.returncode != 0:
            raise HelmError(f"helm template {' '.join(flags)} failed:\n{done.stderr}")
        return done.stdout
