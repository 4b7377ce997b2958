"""The C extension runs under CPython 3.13, not only compiles against its headers.

vLLM's and SGLang's own images run Python 3.12 and later. ``scripts/deps/python313.sh``
unpacks Debian 13's CPython 3.13 (with its own glibc, nothing installed) and a venv with
kvobs's pure-Python dependencies; ``--test`` copies this working tree, builds
``kvobs.kernels._native`` for 3.13 with ``setup.py`` and runs the C extension's tests
there (the reuse, thrash and residency cores against their oracles and under the recorder,
the vLLM pool walk, the C sources' compile). No torch for 3.13: the copy loops' tests need
it and run under 3.11 only. Locally a missing interpreter skips; under ``CI`` it fails.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from tests.required import REPO, missing

VENV_PYTHON = REPO / ".tools" / "python3.13-root" / "venv" / "bin" / "python"


def test_the_c_extension_s_tests_pass_under_cpython_3_13(tmp_path: Path) -> None:
    if not VENV_PYTHON.exists():
        missing(f"{VENV_PYTHON} is missing: run `bash scripts/deps/python313.sh`")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KVOBS_", "PYTEST_"))}
    proc = subprocess.run(
        ["bash", "scripts/deps/python313.sh", "--test", str(tmp_path / "tree"), "-q"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False)
    output = proc.stdout[-6000:] + proc.stderr[-2000:]
    assert proc.returncode == 0, output
    assert re.search(r"^python 3\.13\.\d+: .*_native\.cpython-313-x86_64-linux-gnu\.so",
                     proc.stdout, re.M), output
    summary = proc.stdout.strip().splitlines()[-1]
    passed = re.search(r"(\d+) passed", summary)
    assert passed and int(passed.group(1)) >= 119, summary  # every test of the list
    assert not re.search(r"failed|error|skipped", summary), summary
