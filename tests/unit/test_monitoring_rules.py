"""The Prometheus rules shipped in slurmgpu/monitoring/rules.yml (issue 38 item 1).

``promtool check rules`` validates the file and ``promtool test rules`` runs the unit
tests of tests/monitoring/rules_test.yml, which give each alert input series where it
fires (and a neighbour where it must not) and each recording rule known input. promtool
comes with Debian's ``prometheus`` (scripts/bootstrap.sh); where ``SGPU_REQUIRE_TOOLS``
names it (scripts/test.sh) a missing promtool fails these tests instead of skipping them
(tests/tier_guard.py ``need_tool``).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from slurmgpu.cli.main import main
from slurmgpu.monitoring import rules_text
from tests.tier_guard import need_tool

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "slurmgpu" / "monitoring" / "rules.yml"
RULES_TEST = ROOT / "tests" / "monitoring" / "rules_test.yml"
METRICS_DOC = ROOT / "docs" / "metrics.md"
INSTALL = "apt-get install prometheus; scripts/bootstrap.sh does"


def _promtool() -> str:
    return need_tool("promtool", INSTALL)


def _rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def _promtool_test(promtool: str, rules: Path, tests: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool, "test", "rules", str(tests)],
        cwd=tests.parent,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_promtool_checks_the_shipped_rules() -> None:
    proc = subprocess.run(
        [_promtool(), "check", "rules", str(RULES)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(_rules())} rules found" in proc.stdout


def test_promtool_unit_tests_of_every_rule_pass() -> None:
    proc = _promtool_test(_promtool(), RULES, RULES_TEST)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


def test_every_alert_fires_and_every_recording_rule_is_checked_in_the_unit_tests() -> None:
    doc = yaml.safe_load(RULES_TEST.read_text())
    fired = {
        case["alertname"]
        for test in doc["tests"]
        for case in test.get("alert_rule_test", [])
        if case.get("exp_alerts")
    }
    quiet = {
        case["alertname"]
        for test in doc["tests"]
        for case in test.get("alert_rule_test", [])
        if not case.get("exp_alerts")
    }
    checked = {case["expr"] for test in doc["tests"] for case in test.get("promql_expr_test", [])}
    alerts = {r["alert"] for r in _rules() if "alert" in r}
    records = {r["record"] for r in _rules() if "record" in r}
    assert alerts - fired == set(), "alerts never shown firing"
    assert alerts - quiet == set(), "alerts never shown quiet"
    assert records - checked == set(), "recording rules without a promql_expr_test"


def _copy_with(tmp_path: Path, old: str, new: str) -> Path:
    """The rules and their tests in tmp_path, the rules with ``old`` replaced once."""
    text = RULES.read_text()
    assert text.count(old) == 1, old
    (tmp_path / "slurmgpu" / "monitoring").mkdir(parents=True)
    (tmp_path / "slurmgpu" / "monitoring" / "rules.yml").write_text(text.replace(old, new))
    (tmp_path / "tests" / "monitoring").mkdir(parents=True)
    shutil.copy(RULES_TEST, tmp_path / "tests" / "monitoring" / "rules_test.yml")
    return tmp_path / "tests" / "monitoring" / "rules_test.yml"


# Three promtool runs of about 2 s each: the check of the check runs with the slow tier,
# so the unit tier stays near a minute (the rules' own promtool tests stay in it).
@pytest.mark.slow
@pytest.mark.parametrize(
    ("old", "new", "named"),
    [
        # an alert that waits longer than it should
        (
            'expr: up{job="slurmgpu"} == 0\n        for: 2m',
            'expr: up{job="slurmgpu"} == 0\n        for: 20m',
            "SgpuDaemonDown",
        ),
        # a metric name that does not exist: the alert never fires
        ("sgpu_store_up == 0", "sgpu_store_ok == 0", "SgpuStoreUnhealthy"),
        # a recording rule that loses its partition label
        (
            "expr: sum by (instance, partition) (sgpu_gpus_used)\n",
            "expr: sum by (instance) (sgpu_gpus_used)\n",
            "partition:sgpu_gpus_used:sum",
        ),
    ],
)
def test_a_broken_rule_fails_the_unit_tests(tmp_path: Path, old: str, new: str, named: str) -> None:
    proc = _promtool_test(_promtool(), RULES, _copy_with(tmp_path, old, new))
    assert proc.returncode != 0, proc.stdout
    assert named in proc.stdout + proc.stderr


def test_rules_use_only_metrics_the_daemon_documents() -> None:
    """Every sgpu_* family a rule reads is in docs/metrics.md's table (the slurm tier's
    test_prometheus_real.py checks them against a running daemon's /metrics)."""
    documented = set(re.findall(r"^\| `(sgpu_[a-z_]+)`", METRICS_DOC.read_text(), re.M))
    used = set(
        re.findall(r"(?<![:\w])(sgpu_[a-z_]+)(?![:\w])", " ".join(str(r["expr"]) for r in _rules()))
    )
    assert used, "no metric found in the rules"
    assert used - documented == set()


def test_sgpu_monitoring_rules_prints_and_writes_the_packaged_file(tmp_path: Path) -> None:
    assert rules_text() == RULES.read_text()
    runner = CliRunner()
    printed = runner.invoke(main, ["monitoring", "rules"])
    assert printed.exit_code == 0, printed.output
    assert printed.output == RULES.read_text()
    out = tmp_path / "slurmgpu.yml"
    written = runner.invoke(main, ["monitoring", "rules", "-o", str(out)])
    assert written.exit_code == 0, written.output
    assert out.read_text() == RULES.read_text()
    assert "sgpu monitoring rules -o" in runner.invoke(main, ["monitoring", "rules", "-h"]).output
