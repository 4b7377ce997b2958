"""The mutation check's mutants still apply: a code change that moves a snippet a mutant
edits must update the mutant too, or ``scripts/mutation_check.py`` stops proving anything."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_every_mutant_snippet_is_found_once():
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "mutation_check.py"),
                           "--check"], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "every snippet found once" in proc.stdout
