"""``kvobs report`` reads the dashboard JSON kvobs ships, never the grafanalib sources."""

import json
import subprocess
import sys
from pathlib import Path

from kvobs.report.boards import dashboard_json, dashboard_stems

REPO = Path(__file__).resolve().parents[2]


def test_shipped_dashboards_are_the_generated_files():
    generated = sorted((REPO / "dashboards" / "generated").glob("*.json"))
    assert dashboard_stems() == sorted(p.stem for p in generated)
    for path in generated:
        assert dashboard_json(path.stem) == json.loads(path.read_text())


def test_report_runs_without_grafanalib_or_yaml():
    code = (
        "import sys\n"
        "for name in ('grafanalib', 'yaml', 'attr'):\n"
        "    sys.modules[name] = None\n"
        "from kvobs.cli import main\n"
        "sys.exit(main(['report', '--prometheus', 'http://127.0.0.1:1', '--out', 'x.png']))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60, cwd=REPO / "tests")
    assert result.returncode == 2
    # it got as far as asking Prometheus for the first panel of the shipped dashboard
    assert "panel 'Capacity per tier (tokens)'" in result.stderr, result.stderr
    assert "cannot reach Prometheus" in result.stderr and "Traceback" not in result.stderr
