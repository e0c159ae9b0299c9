"""``sgpu report`` on a store filled by the real stack: figures against hand-computed totals.

Four short jobs run on the lab cluster under their own account (so jobs of other tests
that the daemon also sees cannot blur the group's figures): 2 GPUs at 80 %, 1 GPU at 30 %
that goes idle after 8 s, 1 GPU with no process, and 2 of a node's 16 shards (4 per GPU:
half a GPU) at 50 %. Once they finished and the daemon wrote their summaries, the totals
are computed by hand here: run times and GPU counts from Slurm (``scontrol show job``),
utilisation and idle time from each job's summary, per GPU. ``sgpu report --format
json`` must agree, read from the jobs (a window of minutes, bucketed by hour) and read
from the per-day rollups (a window of whole days that holds today).
"""

from __future__ import annotations

import json
import re
import subprocess
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import select

from slurmgpu.store import open_store, schema
from tests.polling import wait_for
from tests.slurm.harness import Telemetry

# Why not the site profile (tests/unit/test_slurm_tier_labs.py)
DEFAULT_LAB = "the stack (harness.running_stack): one agent on each 4-node lab node, gpu1-gpu4"

ACCOUNT = "sgpu-report"
approx = pytest.approx


def _scontrol(job_id: int) -> dict[str, str]:
    out = subprocess.run(
        ["scontrol", "-o", "show", "job", str(job_id)],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    return dict(re.findall(r"(\w+)=(\S*)", out))


def _slurm_time(text: str) -> datetime:
    """scontrol prints the host's local time without a zone."""
    return datetime.fromisoformat(text).astimezone(UTC)


def _gpus(info: dict[str, str]) -> float:
    """GPU-equivalents from what Slurm allocated per node (``TresPerNode=gres:gpu:2``;
    TRES has no gres without accounting): shards / 4 (16 on the lab's 4 GPUs per node)."""
    m = re.fullmatch(r"gres[:/](gpu|shard)(?::[^:,]+)?:(\d+)", info.get("TresPerNode", ""))
    assert m, f"no GPUs or shards in {info.get('TresPerNode')!r}"
    count = float(m.group(2)) * int(info["NumNodes"].split("-")[0])
    return count if m.group(1) == "gpu" else count / 4


def _by_hand(t: Telemetry, jobs: list[int]) -> dict[str, float]:
    """Allocated, used and idle GPU-hours of ``jobs`` (the report's definitions)."""
    total = {"allocated": 0.0, "used": 0.0, "idle": 0.0, "with_usage": 0.0, "jobs_with_usage": 0}
    for job_id in jobs:
        info = _scontrol(job_id)
        assert info["JobState"] == "COMPLETED", info
        elapsed = (_slurm_time(info["EndTime"]) - _slurm_time(info["StartTime"])).total_seconds()
        alloc = _gpus(info) * elapsed / 3600
        summary = t.usage().summary(job_id)
        assert summary is not None
        per_gpu = [g for node in summary["nodes"].values() for g in node.get("gpus", {}).values()]
        total["allocated"] += alloc
        if not per_gpu:
            continue
        count = max(len(per_gpu), summary["gpus_requested"])  # silent GPUs count as 0 %
        util = sum(g["util_pct_mean"] for g in per_gpu) / count
        idle_shares = [
            1.0 if g["never_busy"] else min(g["idle_trailing_s"] / elapsed, 1.0) for g in per_gpu
        ]
        idle = (sum(idle_shares) + count - len(per_gpu)) / count
        total["used"] += alloc * util / 100
        total["idle"] += alloc * idle
        total["with_usage"] += alloc
        total["jobs_with_usage"] += 1
    return total


def _report(t: Telemetry, *args: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(t.run("report", "--by", "account", "--format", "json", *args))
    return doc


def _check(doc: dict[str, Any], want: dict[str, float], jobs: int) -> None:
    (group,) = [g for g in doc["groups"] if g["name"] == ACCOUNT]
    assert group["jobs"] == jobs
    assert group["jobs_with_usage"] == want["jobs_with_usage"]
    # A second of run time on 2 GPUs is 0.00056 GPU-h: the sums must agree far closer.
    assert group["gpu_hours_allocated"] == approx(want["allocated"], rel=1e-6)
    assert group["gpu_hours_with_usage"] == approx(want["with_usage"], rel=1e-6)
    assert group["gpu_hours_used"] == approx(want["used"], rel=1e-6)
    assert group["gpu_hours_idle"] == approx(want["idle"], rel=1e-6)
    assert group["gpu_hours_unused"] == approx(want["allocated"] - want["used"], rel=1e-6)
    assert group["efficiency_pct"] == approx(100 * want["used"] / want["with_usage"], rel=1e-6)


@pytest.mark.slow
def test_report_figures_match_slurm_and_the_summaries(stack: Telemetry) -> None:
    t = stack
    started = datetime.now(UTC).replace(microsecond=0)
    a = ("-A", ACCOUNT)
    jobs = [
        t.submit(*a, "--gres=gpu:2", "-w", "gpu1", "--wrap",
                 t.fakeload("--util", "80", "--mem", "4GiB", "--duration", "20s")),
        t.submit(*a, "--gres=gpu:1", "-w", "gpu2", "--wrap",
                 t.fakeload("--util", "30", "--mem", "1GiB", "--pattern", "idle-after:8s",
                            "--duration", "20s")),
        t.submit(*a, "--gres=gpu:1", "-w", "gpu3", "--wrap", "sleep 15"),
        t.submit(*a, "--gres=shard:2", "-w", "gpu4", "--wrap",
                 t.fakeload("--util", "50", "--mem", "1GiB", "--duration", "20s")),
    ]  # fmt: skip

    def finished_with_summaries() -> bool:
        done = all(_scontrol(j).get("JobState") == "COMPLETED" for j in jobs)
        return done and all(t.usage().summary(j) is not None for j in jobs)

    wait_for("four finished jobs with summaries", finished_with_summaries, timeout_s=150)
    until = datetime.now(UTC).replace(microsecond=0) + timedelta(minutes=1)
    want = _by_hand(t, jobs)
    print(f"by hand: {want}")
    # The declared loads, loosely (the first samples of a job can precede its fakeload).
    assert 4 * 20 / 3600 * 0.5 < want["allocated"] < (2 + 1 + 1 + 0.5) * 40 / 3600
    assert want["jobs_with_usage"] == 4  # the sleeping job's GPU reported 0 %, never busy
    assert 0.2 < want["used"] / want["allocated"] < 0.7

    minutes = _report(t, "--since", started.isoformat())  # read from the jobs, by hour
    assert minutes["bucket_s"] == 3600
    assert minutes["shards_per_gpu"] == 4.0
    _check(minutes, want, len(jobs))
    # Nothing but these jobs ended since the test started: the totals are theirs.
    assert minutes["totals"]["gpu_hours_allocated"] == approx(want["allocated"], rel=1e-6)
    assert sum(b["jobs"] for b in minutes["efficiency_histogram"]) == len(jobs)
    assert minutes["efficiency_histogram"][0]["jobs"] >= 1  # the sleeping job: 0 %
    # The whatif section on the same window: these four jobs replayed on the lab's four
    # 4-GPU nodes, the same figures `sgpu whatif --json` prints for that window.
    window = ("--since", started.isoformat(), "--until", until.isoformat())
    whatif = _report(t, *window, "--whatif")["whatif"]
    assert whatif == json.loads(t.run("whatif", *window, "--json"))
    assert whatif["jobs"] == len(jobs) and whatif["cluster"] == "4x4"
    assert list(whatif["sets"]) == ["slurm", "rightsize", "colocate", "malleable", "all"]
    assert whatif["jobs_without_usage"] == 0
    assert "simulator figures, not measurements" in whatif["notes"][0]

    midnight = started.replace(hour=0, minute=0, second=0)
    days = _report(  # whole days: today is read from its rollup
        t,
        "--since",
        (midnight - timedelta(days=3)).isoformat(),
        "--until",
        (midnight + timedelta(days=1)).isoformat(),
    )
    assert days["bucket_s"] == 86400
    assert not [n for n in days["notes"] if "rollups" in n], days["notes"]
    with open_store(t.db, migrate=False).engine.connect() as conn:
        b = schema.report_built
        built = set(conn.execute(select(b.c.bucket).where(b.c.span == 86400)).scalars())
    assert int(midnight.timestamp()) // 86400 in built  # today came from its rollup
    _check(days, want, len(jobs))
    today = days["series"][-1]
    assert today["start"] == midnight.isoformat() and today["jobs"] >= len(jobs)
