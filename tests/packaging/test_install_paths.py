"""Install paths that work on any machine, as the README tells them.

* ``TORCH_INDEX_URL`` (empty by default: pip's own configuration) is where every torch
  comes from: the Makefile's ``.venv`` and the engine venvs of ``scripts/deps/engines.sh``
  (run here against a recording stand-in for the venv's Python, so nothing is installed).
* ``make dist`` exists (tests/packaging/test_wheel_smoke.py builds through it).
* Every Dockerfile installs kvobs from what exists (the checkout, or the sdist of ``make
  dist``), never ``pip install kvobs`` from an index where it is not published; so does
  every install command in the README, the docs and the chart.
* No package registry's host name is written anywhere in the repository.
* The Prometheus configuration of the docs (``docs/deployment/prometheus.md``) passes
  ``promtool check config`` with the rules ``kvobs dashboards --out`` writes; the Grafana
  page (``docs/deployment/grafana.md``) names the Grafana version the dashboards' schema
  pins and provisions the folder ``kvobs dashboards --out`` fills.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.required import REPO, find_tool, missing

INDEX = "http://torch-index.invalid/whl/cpu"
TORCH_PIN = "torch==2.13.0"


def _tracked(*patterns: str) -> list[Path]:
    listed = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others",
                             "--exclude-standard", *patterns],
                            capture_output=True, check=True).stdout.decode().split("\0")
    return [REPO / name for name in listed if name and (REPO / name).is_file()]


def _make_dry_run(*args: str) -> str:
    if shutil.which("make") is None:
        missing("make is not installed")
    env = {k: v for k, v in os.environ.items() if k != "TORCH_INDEX_URL"}
    done = subprocess.run(["make", "-n", "-C", str(REPO), *args], capture_output=True,
                          text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _torch_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if TORCH_PIN in line]


def test_make_installs_torch_from_torch_index_url(tmp_path):
    venv = tmp_path / "venv"  # absent: make plans the whole set-up
    (line,) = _torch_lines(_make_dry_run("setup", f"VENV={venv}", f"TORCH_INDEX_URL={INDEX}"))
    assert f"--index-url {INDEX} {TORCH_PIN}" in line
    (line,) = _torch_lines(_make_dry_run("setup", f"VENV={venv}"))
    assert "--index-url" not in line  # empty: the machine's pip configuration applies


def test_make_dist_builds_the_sdist_and_the_wheel():
    assert "-m build --outdir dist" in _make_dry_run("dist", "-o", ".venv/bin/kvobs")


STAND_IN = """#!/bin/sh
# The venv's python: `-m venv DIR` makes DIR/bin/python this script; anything else is
# recorded and fails, which stops engines.sh at its first install.
if [ "$1" = "-m" ] && [ "$2" = "venv" ]; then
    mkdir -p "$3/bin" && cp "$0" "$3/bin/python" && exit 0
fi
echo "$@" >> "{log}"
exit 3
"""


@pytest.mark.parametrize("index", [INDEX, ""])
def test_engine_venvs_install_torch_from_torch_index_url(tmp_path, index):
    repo = tmp_path / "repo"
    shutil.copytree(REPO / "scripts" / "deps", repo / "scripts" / "deps")
    log = tmp_path / "pip.log"
    python = tmp_path / "python"
    python.write_text(STAND_IN.replace("{log}", str(log)))
    python.chmod(0o755)
    env = {**os.environ, "KVOBS_ENGINE_PYTHON": str(python), "TORCH_INDEX_URL": index}
    done = subprocess.run(["bash", str(repo / "scripts/deps/engines.sh"), "lmcache"],
                          capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode != 0  # stopped by the stand-in, after the first install
    (first,) = log.read_text().splitlines()
    assert first.startswith("-m pip install") and first.endswith(TORCH_PIN), first
    assert (f"--index-url {INDEX} " in first) == bool(index), first


# `pip install kvobs`, `kvobs[demo]`, `kvobs==0.1.0`: a requirement an index must serve.
# (Adding an extra to an installed kvobs, as the CLI's missing-extra errors say, works
# without an index: pip keeps the installed kvobs and adds the extra's packages. Those
# messages live in kvobs/*.py, which this check leaves out.)
INDEX_INSTALL = re.compile(r"pip3? install\b[^\n]*?(?<![\w./-])['\"]?kvobs(?:\[[\w,]+\])?"
                           r"(?:[=<>~!]=?[\w.*]+)?(?![\w./*-])", re.M)


def _docs(*more: str) -> list[Path]:
    """What a user reads or runs to install: docs, Dockerfiles, values, make and scripts."""
    return [p for p in _tracked("*.md", "*Dockerfile*", "*.yaml", "*.yml", "Makefile", "*.sh",
                                "*.txt", *more)
            if "tests/packaging/test_install_paths.py" not in str(p)]


def test_nothing_tells_a_user_to_install_kvobs_from_an_index():
    found = [f"{p.relative_to(REPO)}: {m.group(0)}" for p in _docs()
             for m in INDEX_INSTALL.finditer(p.read_text(errors="replace"))]
    assert not found, "kvobs is not on the package index yet:\n" + "\n".join(found)


def test_the_pattern_finds_an_index_install():
    for text in ("pip install kvobs", "RUN pip install --no-cache-dir kvobs\n",
                 "pip install 'kvobs[demo]'", "pip install kvobs==0.1.0",
                 "(pip install 'kvobs[nvml]')", "pip install kvobs; kvobs top"):
        assert INDEX_INSTALL.search(text), text
    for text in ("pip install -e '.[demo]'", 'pip install "$(ls dist/kvobs-*.whl)[demo]"',
                 "pip install /tmp/kvobs/kvobs-*.tar.gz", "pip install kvobs-0.1.0.tar.gz"):
        assert not INDEX_INSTALL.search(text), text


def test_every_dockerfile_installs_kvobs_from_the_checkout_or_the_sdist():
    dockerfiles = _tracked("Dockerfile", "*/Dockerfile", "*.Dockerfile")
    assert {p.relative_to(REPO).as_posix() for p in dockerfiles} >= {
        "Dockerfile", "helm/kvobs/examples/vllm.Dockerfile"}
    for path in dockerfiles:
        text = re.sub(r"\\\n", " ", path.read_text())
        installs = [line for line in text.splitlines()
                    if line.startswith("RUN") and "pip install" in line and "torch==" not in line]
        assert installs, f"{path}: no pip install of kvobs"
        for line in installs:
            assert re.search(r"pip install [^\n]*(\"\.|'\.|\s\.|kvobs-\*\.tar\.gz)", line), (
                f"{path}: {line}")


REGISTRY_HOSTS = ("pypi.org", "pythonhosted.org", "download.pytorch.org", "npmjs.org",
                  "npmjs.com", "anaconda.org")


def test_no_package_registry_host_is_written_in_the_repository():
    found = [f"{p.relative_to(REPO)}: {host}"
             for p in _docs("*.py", "*.json", "*.cfg", "*.toml", "*.in", "*.c", "*.tpl", "*.txt")
             for host in REGISTRY_HOSTS
             if host in p.read_text(errors="replace")
             and "tests/packaging/test_install_paths.py" not in str(p)]
    assert not found, found


PROMETHEUS_PAGE = REPO / "docs" / "deployment" / "prometheus.md"
GRAFANA_PAGE = REPO / "docs" / "deployment" / "grafana.md"


def _docs_prometheus_yml() -> str:
    section = PROMETHEUS_PAGE.read_text()
    blocks = [b for b in re.findall(r"```yaml\n(.*?)```", section, flags=re.S)
              if "scrape_configs" in b]
    assert len(blocks) == 1, "the docs' Prometheus page should hold one prometheus.yml"
    return blocks[0]


def test_docs_prometheus_config_loads_the_rules_kvobs_writes(tmp_path):
    promtool = find_tool("promtool", "scripts/deps/prometheus.sh")
    out = tmp_path / "kvobs"
    done = subprocess.run([sys.executable, "-m", "kvobs", "dashboards", "--out", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    config = _docs_prometheus_yml()
    assert "/etc/kvobs/rules/*.rules.yaml" in config
    (tmp_path / "prometheus.yml").write_text(config.replace("/etc/kvobs", str(out)))
    done = subprocess.run([str(promtool), "check", "config", str(tmp_path / "prometheus.yml")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "kvobs-alerts.rules.yaml" in done.stdout + done.stderr


def _dockerfile_run_installing_torch() -> str:
    text = re.sub(r"\\\n", " ", (REPO / "Dockerfile").read_text())
    (run,) = [line[len("RUN "):] for line in text.splitlines()
              if line.startswith("RUN ") and "torch==" in line]
    return run


@pytest.mark.parametrize("index", [INDEX, ""])
def test_the_demo_image_installs_torch_from_torch_index_url(index):
    """The Dockerfile's torch RUN line, run by sh with pip and venv replaced by echo."""
    args = re.findall(r"^ARG (\w+)", (REPO / "Dockerfile").read_text(), flags=re.M)
    assert {"TORCH_INDEX_URL", "TORCH_VERSION"} <= set(args)
    run = (_dockerfile_run_installing_torch()
           .replace("python -m venv /opt/kvobs", "true").replace("/opt/kvobs/bin/pip", "echo"))
    done = subprocess.run(["sh", "-c", run], capture_output=True, text=True, timeout=30,
                          env={"PATH": os.environ["PATH"], "TORCH_INDEX_URL": index,
                               "TORCH_VERSION": "2.13.0"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith(TORCH_PIN), done.stdout
    assert (f"--index-url {INDEX} " in done.stdout) == bool(index), done.stdout


def test_docs_grafana_page_matches_the_schema_and_what_dashboards_out_writes(tmp_path):
    section = GRAFANA_PAGE.read_text()
    source = json.loads((REPO / "dashboards" / "schema" / "source.json").read_text())
    major_minor = ".".join(source["version"].split(".")[:2])
    assert f"**Grafana {major_minor} or newer**" in section
    assert f"`@grafana/schema` {source['version']}" in section
    assert f"schemaVersion {source['schemaVersion']}" in section
    (provisioning,) = [yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", section,
                                                              flags=re.S) if "providers" in b]
    (provider,) = provisioning["providers"]
    assert provisioning["apiVersion"] == 1 and provider["type"] == "file"
    root = Path(provider["options"]["path"]).parent
    assert f"kvobs dashboards --out {root}" in section
    out = tmp_path / "kvobs"
    done = subprocess.run([sys.executable, "-m", "kvobs", "dashboards", "--out", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    written = sorted(p.name for p in (out / Path(provider["options"]["path"]).name).iterdir())
    assert written and all(f"`{root}/dashboards/{name}`" in section or name in section
                           for name in written), written
