"""`helm package` ships the chart with its generated files, schema and example."""

from __future__ import annotations

import tarfile
from pathlib import Path

from tests.helm.helm_render import HelmChart


def test_package_carries_files_schema_and_example(
    chart: HelmChart, generated_files: dict[str, list[Path]], tmp_path: Path
) -> None:
    done = chart.run("package", str(chart.chart_dir), "--destination", str(tmp_path))
    assert done.returncode == 0, done.stderr
    (archive,) = tmp_path.glob("kvobs-*.tgz")
    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
    expected = {
        "kvobs/Chart.yaml",
        "kvobs/values.yaml",
        "kvobs/values.schema.json",
        "kvobs/templates/NOTES.txt",
        "kvobs/examples/vllm-values.yaml",
        "kvobs/examples/vllm-multiprocess-values.yaml",
        "kvobs/examples/vllm.Dockerfile",
        *(f"kvobs/files/{kind}/{p.name}" for kind, ps in generated_files.items() for p in ps),
    }
    assert expected <= names, sorted(expected - names)
