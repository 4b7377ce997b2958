"""Rule files: promtool accepts them, every rule has a promtool unit test, alerts read well."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml

from kvobs.dashboards.promql import problems
from kvobs.dashboards.recording_rules import recorded_names

HERE = Path(__file__).resolve().parent
UNIT_TESTS = sorted((HERE / "promtool").glob("*.test.yaml"))


def rule_files(repo: Path) -> list[Path]:
    return sorted((repo / "dashboards" / "rules").glob("*.rules.yaml"))


def rules(repo: Path) -> list[dict[str, Any]]:
    return [
        rule
        for path in rule_files(repo)
        for group in yaml.safe_load(path.read_text())["groups"]
        for rule in group["rules"]
    ]


def run(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in args], capture_output=True, text=True, timeout=120, cwd=HERE / "promtool"
    )


def test_promtool_check_rules(promtool: Path, repo: Path) -> None:
    result = run(promtool, "check", "rules", *rule_files(repo))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") == 2


def test_promtool_unit_tests_pass(promtool: Path) -> None:
    assert UNIT_TESTS
    result = run(promtool, "test", "rules", *UNIT_TESTS)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_promtool_unit_tests_catch_a_wrong_expectation(promtool: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken.test.yaml"
    text = UNIT_TESTS[0].read_text().replace("value: 0.25", "value: 0.3", 1)
    text = text.replace("../../../dashboards", str(HERE.parents[1] / "dashboards"))
    broken.write_text(text)
    result = run(promtool, "test", "rules", broken)
    assert result.returncode != 0
    assert "FAILED" in result.stdout + result.stderr


def test_every_rule_has_a_unit_test(repo: Path) -> None:
    tested_exprs, tested_alerts = set(), set()
    for path in UNIT_TESTS:
        for case in yaml.safe_load(path.read_text())["tests"]:
            tested_exprs |= {t["expr"] for t in case.get("promql_expr_test", [])}
            for t in case.get("alert_rule_test", []):
                if t.get("exp_alerts"):  # a test that sees the alert fire
                    tested_alerts.add(t["alertname"])
    for rule in rules(repo):
        if "record" in rule:
            assert any(rule["record"] in expr for expr in tested_exprs), rule["record"]
        else:
            assert rule["alert"] in tested_alerts, f"{rule['alert']} never fires in a test"


def test_alerts_have_runbook_descriptions(repo: Path) -> None:
    alerts = [r for r in rules(repo) if "alert" in r]
    assert {a["alert"] for a in alerts} >= {
        "KvobsHostPoolThrashing",
        "KvobsTierFullWithEvictions",
        "KvobsTransferLatencyHigh",
        "KvobsOffloadDrops",
        "KvobsTransferFailures",
        "KvobsTargetAbsent",
    }
    for alert in alerts:
        assert alert["labels"]["severity"] in {"info", "warning", "critical"}
        assert alert["for"]
        description = alert["annotations"]["description"]
        for section in ("What:", "Check:", "Fix:"):
            assert section in description, f"{alert['alert']} lacks {section}"
        assert alert["annotations"]["summary"]


def test_rule_expressions_name_only_catalog_metrics(repo: Path) -> None:
    found = [
        f"{rule.get('record') or rule.get('alert')}: {p}"
        for rule in rules(repo)
        for p in problems(rule["expr"], recorded_names())
    ]
    assert not found, "\n".join(found)
