"""The C extension's sources compile, warnings as errors, against every CPython it meets.

The engines' own images run Python 3.12 and later, while this machine runs 3.11 alone; a
source that no longer compiles there would fail kvobs's install in those images. Each
source (every ``kernels/*.c``, as setup.py builds them) is compiled (syntax and types, no
object code) against the running interpreter's headers and against CPython 3.13's
(``scripts/deps/python_headers.sh`` unpacks Debian 13's; ``make deps`` runs it).
"""

from __future__ import annotations

import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest

from tests.required import REPO, missing

SOURCES = sorted(path.relative_to(REPO).as_posix() for path in (REPO / "kernels").glob("*.c"))
FLAGS = ("-Wall", "-Wextra", "-Wno-unused-parameter", "-Wno-missing-field-initializers",
         "-Werror", "-O2", "-std=c11", "-fsyntax-only")
PY313 = REPO / ".tools" / "python3.13" / "include"


def include_dirs(python: str) -> list[Path]:
    if python == "running":
        return [Path(sysconfig.get_paths()["include"])]
    if not (PY313 / "python3.13" / "Python.h").is_file():
        missing(f"CPython 3.13 headers not in {PY313}; run `bash scripts/deps/python_headers.sh`")
    return [PY313 / "python3.13", PY313]  # pyconfig.h includes <x86_64-linux-gnu/...>


def gcc() -> str:
    found = shutil.which("gcc")
    if found is None:
        missing("gcc not found (the C extension's compiler)")
    return found


def compile_with(python: str, *args: str) -> subprocess.CompletedProcess[str]:
    includes = [f"-I{d}" for d in include_dirs(python)]
    return subprocess.run([gcc(), *includes, *args], capture_output=True, text=True,
                          timeout=120, cwd=REPO)


@pytest.mark.parametrize("python", ["running", "3.13"])
@pytest.mark.parametrize("source", SOURCES)
def test_each_source_compiles_without_a_warning(python: str, source: str) -> None:
    done = compile_with(python, *FLAGS, source)
    assert done.returncode == 0, f"{source} against {python} headers:\n{done.stderr}"
