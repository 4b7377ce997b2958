"""The Dockerfile the chart's image comes from: linted by hadolint, consistent with the chart.

The image cannot be built in CI (no Docker daemon); these checks keep it honest anyway.
"""

from __future__ import annotations

import fnmatch
import json
import subprocess

import yaml

from tests.helm.helm_render import CHART_DIR, REPO, dockerfile_instructions, find_tool

DOCKERFILE = REPO / "Dockerfile"


def test_hadolint_passes() -> None:
    hadolint = find_tool("hadolint")
    done = subprocess.run(
        [str(hadolint), "--no-color", "--format", "json", str(DOCKERFILE)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, json.dumps(json.loads(done.stdout or "[]"), indent=2)


def test_image_runs_as_the_numeric_user_the_chart_expects() -> None:
    # runAsNonRoot can only be verified by the kubelet for a numeric USER.
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())["demo"]
    (user,) = dockerfile_instructions("USER")
    uid, _, gid = user.partition(":")
    assert uid.isdigit() and int(uid) != 0
    assert int(uid) == values["podSecurityContext"]["runAsUser"]
    assert int(gid) == values["podSecurityContext"]["runAsGroup"]


def test_entrypoint_and_port_match_the_demo_deployment() -> None:
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())["demo"]
    assert dockerfile_instructions("ENTRYPOINT") == ['["kvobs"]']
    (cmd,) = dockerfile_instructions("CMD")
    assert json.loads(cmd) == ["demo", "--metrics-addr", f"0.0.0.0:{values['port']}"]
    assert dockerfile_instructions("EXPOSE") == [str(values["port"])]


def test_build_context_holds_everything_copied() -> None:
    """Each COPY source exists and survives the .dockerignore allow-list."""
    patterns = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]

    def ignored(path: str) -> bool:
        verdict = False
        for pattern in patterns:
            negated = pattern.startswith("!")
            bare = pattern.lstrip("!").rstrip("/")
            if fnmatch.fnmatch(path, bare) or fnmatch.fnmatch(path, bare.replace("**/", "")):
                verdict = not negated
        return verdict

    sources = [
        src
        for args in dockerfile_instructions("COPY")
        if not args.startswith("--from")
        for src in args.split()[:-1]
    ]
    assert sources, "the Dockerfile copies the project in"
    for src in sources:
        assert (REPO / src).exists(), f"COPY {src}: missing from the repository"
        assert not ignored(src), f"COPY {src}: excluded by .dockerignore"
