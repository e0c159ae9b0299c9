"""A real Prometheus scrapes the lab's daemon and evaluates the shipped rules (issue 38
item 3).

Debian's ``prometheus`` runs on a free 127.0.0.1 port with its own TSDB in the test's
tmp dir, scraping the daemon every second and evaluating slurmgpu/monitoring/rules.yml
every second (the test's copy: group intervals 1 s, SgpuDaemonDown's ``for`` 3 s). The
lab runs a small mixed workload: a busy 2-GPU job, a job that holds a GPU and does
nothing, and a shard job. Through Prometheus' HTTP API the test then checks that

- every rule loaded and evaluates without error (``/api/v1/rules`` health ``ok``);
- every recording rule's series, and its expression queried directly, is a vector with
  the labels its ``by (...)`` keeps (``instance``, ``partition``, ``node``...), and the
  efficiency and idle series say what the workload does;
- every alert's expression evaluates to a vector (empty on this healthy lab);
- every Grafana dashboard panel's query (slurmgpu/monitoring/dashboard.py) is a vector
  with the labels its legend names;
- the per-user series and the agents' last-seen times say what the workload does;
- every sgpu_* family a rule reads is in the daemon's real /metrics;
- stopping the daemon fires SgpuDaemonDown, and does not call the agents silent.

Everything it starts stops with the test (Prometheus in ``finally``, the stack by
``running_stack``); every wait has a deadline.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from slurmgpu.monitoring import dashboard
from tests.polling import wait_for
from tests.ports import free_port
from tests.slurm.harness import Telemetry
from tests.tier_guard import need_tool

# Why not the site profile (tests/unit/test_slurm_tier_labs.py)
DEFAULT_LAB = "the stack (harness.running_stack): one agent on each 4-node lab node, gpu1-gpu4"

RULES = Path(__file__).resolve().parents[2] / "slurmgpu" / "monitoring" / "rules.yml"
JOB = "slurmgpu"  # the scrape job the rules' daemon-down alerts name
# Recording rules the workload cannot feed in bounded time: no policy executes an action
# in this short run, so there is no sgpu_actions_total{outcome="done"} yet.
MAY_BE_EMPTY = {"policy:sgpu_actions_done:increase1h"}
# Queries of what this healthy, short run does not do: execute actions, resize, refuse.
MAY_BE_EMPTY_READING = (
    "sgpu_actions_total",
    "sgpu_transactions",
    "sgpu_samples_refused_total",
    "sgpu_api_rejected_total",
    "sgpu_node_gres_disagreeing",
)


@dataclass
class Prometheus:
    url: str
    proc: subprocess.Popen[bytes]
    log: Path

    def api(self, path: str, **params: str) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        try:
            with urllib.request.urlopen(f"{self.url}/api/v1/{path}{query}", timeout=10) as r:
                body = json.load(r)
        except urllib.error.HTTPError as exc:
            pytest.fail(f"prometheus {path} {params}: {exc.code} {exc.read().decode()[:500]}")
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        data = self.api("query", query=expr)
        assert data["resultType"] == "vector", (expr, data)
        result: list[dict[str, Any]] = data["result"]
        return result

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False


def _test_rules(tmp: Path) -> Path:
    """The shipped rules, evaluated every second, SgpuDaemonDown after 3 s."""
    doc = yaml.safe_load(RULES.read_text())
    for group in doc["groups"]:
        group["interval"] = "1s"
        for rule in group["rules"]:
            if rule.get("alert") == "SgpuDaemonDown":
                rule["for"] = "3s"
    out = tmp / "rules.yml"
    out.write_text(yaml.safe_dump(doc, sort_keys=False))
    return out


@pytest.fixture
def prometheus(stack: Telemetry, tmp_path: Path) -> Iterator[Prometheus]:
    binary = need_tool(
        "prometheus", "apt-get install prometheus; scripts/bootstrap.sh does", "slurm"
    )
    promtool = need_tool("promtool", "apt-get install prometheus", "slurm")
    rules = _test_rules(tmp_path)
    checked = subprocess.run(
        [promtool, "check", "rules", str(rules)], capture_output=True, text=True, check=False
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    config = tmp_path / "prometheus.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "rule_files": [str(rules)],
                "scrape_configs": [
                    {
                        "job_name": JOB,
                        "scrape_timeout": "1s",
                        "static_configs": [{"targets": [f"127.0.0.1:{stack.port}"]}],
                    }
                ],
            }
        )
    )
    port = free_port()
    log = tmp_path / "prometheus.log"
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                "--storage.tsdb.retention.time=1h",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    prom = Prometheus(f"http://127.0.0.1:{port}", proc, log)
    try:
        wait_for("prometheus to be ready", lambda: proc.poll() is not None or prom.ready(), 60)
        assert proc.poll() is None, f"prometheus exited: {log.read_text()[-2000:]}"
        yield prom
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def _kept_labels(expr: str) -> set[str]:
    """The labels an aggregation keeps: its first ``by (...)``."""
    match = re.search(r"\bby \(([^)]*)\)", expr)
    return {name.strip() for name in match.group(1).split(",")} if match else set()


def _samples(prom: Prometheus, expr: str) -> list[dict[str, Any]] | None:
    return prom.query(expr) or None


def test_prometheus_scrapes_the_lab_daemon_and_evaluates_every_rule(
    stack: Telemetry, prometheus: Prometheus
) -> None:
    t, prom = stack, prometheus
    instance = f"127.0.0.1:{t.port}"
    # The mixed workload: busy, allocated-but-idle, and a shard job; 120 s at most.
    t.submit(
        "--gres=gpu:2", "-w", "gpu1", "--wrap", t.fakeload("--util", "80", "--duration", "120s")
    )
    t.submit("--gres=gpu:1", "-w", "gpu2", "--wrap", "sleep 120")
    t.submit(
        "--gres=shard:2", "-w", "gpu3", "--wrap", t.fakeload("--util", "30", "--duration", "120s")
    )

    # The daemon is scraped, and counts 4 GPUs allocated: 2 + 1 whole, and the one the
    # shard job's shards sit on; the agents see 3 of them busy (the sleeping job's idle).
    up = wait_for("the daemon scraped", lambda: _samples(prom, f'up{{job="{JOB}"}} == 1'))
    assert up[0]["metric"]["instance"] == instance
    seen: dict[str, float] = {}

    def gpus() -> bool:
        for name in ("sgpu_gpus_allocated", "sgpu_gpus_used", "sgpu_gpus_idle"):
            seen[name] = sum(float(s["value"][1]) for s in prom.query(name))
        return seen == {"sgpu_gpus_allocated": 4, "sgpu_gpus_used": 3, "sgpu_gpus_idle": 1}

    try:
        wait_for("3 GPUs used of 4 allocated, in Prometheus", gpus, 60)
    finally:
        print(f"GPUs in Prometheus: {seen}")
    wait_for("GPU power samples", lambda: _samples(prom, "count(sgpu_gpu_power_watts) >= 8"))
    # An energy rate needs two scrapes of the counter: over a few seconds of them.
    wait_for(
        "an energy increase", lambda: _samples(prom, "node:sgpu_gpu_energy_kwh:increase1h > 0")
    )

    # Every rule loaded and evaluates cleanly.
    groups = prom.api("rules")["groups"]
    loaded = {r["name"]: r for g in groups for r in g["rules"]}
    shipped = _rules()
    assert set(loaded) == {r.get("record") or r["alert"] for r in shipped}
    bad = {name: r.get("lastError") for name, r in loaded.items() if r["health"] != "ok"}
    assert bad == {}

    # Recording rules: the recorded series and the expression itself, with their labels.
    for rule in (r for r in shipped if "record" in r):
        name, expr = rule["record"], rule["expr"]
        want = _kept_labels(expr)
        assert "instance" in want, name
        for query in (name, expr):
            if name in MAY_BE_EMPTY:
                result = prom.query(query)
            else:
                # idle GPU-hours step on whole minutes: data from the first one on
                result = wait_for(f"{query} to return data", partial(_samples, prom, query), 90)
            for sample in result:
                labels = set(sample["metric"]) - {"__name__"}
                assert labels == want, (name, sample)
                assert sample["metric"]["instance"] == instance
                assert all(sample["metric"][label] for label in want), sample
                float(sample["value"][1])

    def value(expr: str) -> dict[str, float]:
        return {
            ",".join(f"{k}={v}" for k, v in sorted(s["metric"].items()) if k != "__name__"): float(
                s["value"][1]
            )
            for s in prom.query(expr)
        }

    part = f"instance={instance},partition=gpu"
    assert value("partition:sgpu_gpu_efficiency:ratio") == {part: 0.75}
    assert value("cluster:sgpu_gpu_efficiency:ratio") == {f"instance={instance}": 0.75}
    assert value("cluster:sgpu_gpus_allocated:sum") == {f"instance={instance}": 4}
    assert value("partition:sgpu_gpus_idle:sum") == {part: 1}
    assert value("partition:sgpu_gpus_shared:sum") == {part: 1}
    assert value("partition:sgpu_shard_efficiency:ratio") == {part: 1}  # 2 shards, busy
    # a minute or two of one idle GPU, in GPU-hours
    assert 0 < value("partition:sgpu_gpus_idle:gpu_hours_1h")[part] < 0.1
    assert set(value("node:sgpu_gpu_power_watts:sum")) == {
        f"instance={instance},node=gpu{i}" for i in range(1, 5)
    }
    assert value("instance:sgpu_cycles_failed:ratio_rate10m") == {f"instance={instance}": 0}
    assert value("instance:sgpu_samples_ingested:rate5m")[f"instance={instance}"] > 0
    # Waste by user: the lab's one submitting user holds the 3 whole GPUs (the shard
    # job is not counted) and leaves the sleeping job's GPU idle; nobody is "(other)".
    users = value("sgpu_user_gpus_allocated")
    named = {k for k in users if not k.endswith("user=(other)")}
    assert len(named) == 1 and users[named.pop()] == 3, users
    assert sum(value("sgpu_user_gpus_idle").values()) == 1
    assert value('sgpu_user_gpus_allocated{user="(other)"}') == {
        f"instance={instance},job={JOB},user=(other)": 0
    }
    # Every node's agent delivered within the last minute.
    ages = value("time() - sgpu_agent_last_seen_timestamp_seconds")
    assert {k.split("node=")[1].split(",")[0] for k in ages} == {f"gpu{i}" for i in range(1, 5)}
    assert all(0 <= age < 60 for age in ages.values()), ages

    # Alerts: each expression evaluates (a vector), none fires on this healthy lab.
    alerts = [r for r in shipped if "alert" in r]
    for rule in alerts:
        result = prom.query(rule["expr"])
        assert result == [] or rule["alert"] == "SgpuSlurmDataParserUnknown", (rule, result)
    assert prom.api("alerts")["alerts"] == []

    # Every dashboard panel's query, variables filled in as Grafana would, is a vector
    # with the labels its legend names ({{partition}}...), or none for a single stat.
    fill = {
        "$instance": instance,  # a regex matching itself (its dots match any character)
        "$partition": ".*",
        "$__rate_interval": "10s",
        "$__range": "5m",
    }
    for title, q in dashboard.queries():
        expr = q.expr
        for var, val in sorted(fill.items(), key=lambda kv: -len(kv[0])):
            expr = expr.replace(var, val)
        want = set(re.findall(r"\{\{(\w+)\}\}", q.legend))
        if any(metric in expr for metric in MAY_BE_EMPTY_READING):
            result = prom.query(expr)
        else:
            result = wait_for(f"panel {title!r}: {expr}", partial(_samples, prom, expr), 30)
        for sample in result:
            assert set(sample["metric"]) - {"__name__"} == want, (title, expr, sample)
            float(sample["value"][1])

    # The families the rules read are the daemon's own (from its /metrics, series or not).
    with urllib.request.urlopen(f"http://{instance}/metrics", timeout=10) as r:
        exported = {f.name for f in text_string_to_metric_families(r.read().decode())}
    read = set(
        re.findall(r"(?<![:\w])(sgpu_[a-z_]+)(?![:\w])", " ".join(str(r["expr"]) for r in shipped))
    )
    assert {re.sub(r"_(total|bucket|count|sum)$", "", n) for n in read} - exported == set()

    # The daemon stops: up drops to 0 and SgpuDaemonDown fires (for: 3 s here).
    t.stop_daemon()

    def firing() -> list[dict[str, Any]] | None:
        return [
            a
            for a in prom.api("alerts")["alerts"]
            if a["labels"]["alertname"] == "SgpuDaemonDown" and a["state"] == "firing"
        ] or None

    (down,) = wait_for("SgpuDaemonDown to fire", firing, 30)
    assert down["labels"] == {
        "alertname": "SgpuDaemonDown",
        "instance": instance,
        "job": JOB,
        "severity": "critical",
    }
    assert instance in down["annotations"]["summary"]
    states = {a["labels"]["alertname"]: a["state"] for a in prom.api("alerts")["alerts"]}
    assert "SgpuAgentSilent" not in states and "SgpuAgentsSilent" not in states, states
