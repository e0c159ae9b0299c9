"""The Grafana dashboard shipped in slurmgpu/monitoring/dashboard.json (issue 38 item 2).

The JSON is what Grafana's SDK (grafana-foundation-sdk, dev extra) builds from
slurmgpu/monitoring/dashboard.py: a test fails while the committed file differs
(regenerate with ``python -m slurmgpu.monitoring.dashboard``). Every panel query, with the
dashboard's variables filled in, is parsed by promtool as the expression of a recording
rule (promtool has no parse-only command in Debian's 2.42); the slurm tier runs them
against a real Prometheus (tests/slurm/test_prometheus_real.py).
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from slurmgpu.cli.main import main
from slurmgpu.monitoring import dashboard, dashboard_text
from tests.tier_guard import need_tool

ROOT = Path(__file__).resolve().parents[2]
METRICS_DOC = ROOT / "docs" / "metrics.md"
# What Grafana puts in for the dashboard's variables, for a query to stand alone.
VARIABLES = {"$instance": ".*", "$partition": ".*", "$__rate_interval": "1m", "$__range": "1h"}


def filled(expr: str) -> str:
    for name, value in sorted(VARIABLES.items(), key=lambda kv: -len(kv[0])):
        expr = expr.replace(name, value)
    assert "$" not in expr, expr
    return expr


def test_the_committed_json_is_what_the_sdk_builds() -> None:
    assert dashboard.DASHBOARD_FILE.read_text() == dashboard.render(), (
        "dashboard.json is out of date: python -m slurmgpu.monitoring.dashboard"
    )
    assert dashboard.main(["--check"]) == 0


def test_the_dashboard_is_provisionable_and_every_panel_queries_prometheus() -> None:
    board = json.loads(dashboard.DASHBOARD_FILE.read_text())
    assert board["uid"] == dashboard.UID and board["title"] == "slurmgpu"
    assert [v["name"] for v in board["templating"]["list"]] == [
        "datasource",
        "instance",
        "partition",
    ]
    rows = [p["title"] for p in board["panels"] if p["type"] == "row"]
    assert rows == [
        "Cluster",
        "Partitions",
        "Users",
        "Energy",
        "Actions",
        "Daemon",
        "Jobs",
    ]
    panels = [p for p in board["panels"] if p["type"] in ("stat", "timeseries", "bargauge")]
    assert [p["title"] for p in panels] == dashboard.PANELS
    assert len(set(dashboard.PANELS)) == len(dashboard.PANELS)
    for p in panels:
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert p["targets"] and all(t["expr"] for t in p["targets"]), p["title"]
        assert len({t["refId"] for t in p["targets"]}) == len(p["targets"])
        # the daemon's selection applies everywhere
        assert all('instance=~"$instance"' in t["expr"] for t in p["targets"]), p["title"]
        if p["type"] == "bargauge":  # one bar per series: the value now, not a range
            assert all(t.get("instant") for t in p["targets"]), p["title"]
    # waste by user: the bounded per-user series, ranked over the dashboard's range
    by_user = next(p for p in panels if p["title"] == "Idle GPU-hours by user (time range)")
    assert by_user["type"] == "bargauge"
    assert "sgpu_user_gpus_idle" in by_user["targets"][0]["expr"]
    # no two panels overlap on Grafana's 24-column grid
    cells = set()
    for p in board["panels"]:
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, p["title"]
                cells.add((x, y))


def test_promtool_parses_every_panel_query(tmp_path: Path) -> None:
    promtool = need_tool("promtool", "apt-get install prometheus; scripts/bootstrap.sh does")
    rules = [
        {"record": f"panel_query_{i}", "expr": filled(q.expr)}
        for i, (_, q) in enumerate(dashboard.queries())
    ]
    path = tmp_path / "panels.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "panels", "rules": rules}]}))
    proc = subprocess.run(
        [promtool, "check", "rules", str(path)], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(rules)} rules found" in proc.stdout


def test_promtool_refuses_a_broken_panel_query(tmp_path: Path) -> None:
    """The check above does catch a bad query."""
    promtool = need_tool("promtool", "apt-get install prometheus; scripts/bootstrap.sh does")
    broken = filled(dashboard.queries()[0][1].expr).replace(")", "", 1)
    path = tmp_path / "panels.yml"
    path.write_text(
        yaml.safe_dump({"groups": [{"name": "p", "rules": [{"record": "x", "expr": broken}]}]})
    )
    proc = subprocess.run(
        [promtool, "check", "rules", str(path)], capture_output=True, text=True, check=False
    )
    assert proc.returncode != 0


def test_panels_use_only_metrics_the_daemon_documents() -> None:
    documented = set(re.findall(r"^\| `(sgpu_[a-z_]+)`", METRICS_DOC.read_text(), re.M))
    used = set(re.findall(r"\b(sgpu_[a-z_]+)", " ".join(q.expr for _, q in dashboard.queries())))
    used = {re.sub(r"_bucket$", "", n) for n in used}
    assert used and used - documented == set()


@pytest.mark.parametrize("args", [[], ["-o", "dashboard.json"]])
def test_sgpu_monitoring_dashboard_prints_and_writes_the_packaged_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert dashboard_text() == dashboard.DASHBOARD_FILE.read_text()
    result = CliRunner().invoke(main, ["monitoring", "dashboard", *args])
    assert result.exit_code == 0, result.output
    out = (tmp_path / "dashboard.json").read_text() if args else result.output
    assert out == dashboard.DASHBOARD_FILE.read_text()
