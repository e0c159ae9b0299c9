"""Rightsizing never costs a job its run, on the real cluster: a job whose time limit the
daemon lowered from its history runs longer than that history, is killed at the lowered
limit (TIMEOUT), and comes back with the limit it asked for, then finishes.

The time rule runs on a test's clock (1 min minimum and rounding instead of 15 and 5);
the job "resumes from its checkpoint" as a job on the elastic runtime would: its second
run (``SLURM_RESTART_COUNT`` set by Slurm's requeue) takes seconds. In the ``release``
set too: scripts/test.sh runs it on Slurm 24.11 and 26.05 (chroots); it passed on 22.05,
24.11 and 26.05 (2026-12-06).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from slurmgpu.lab.cluster import LabCluster
from slurmgpu.model import JobState
from slurmgpu.tokens import rightsize_opted_out
from tests.configs import QUICK_POLICY, config_toml
from tests.polling import wait_for
from tests.slurm.harness import Telemetry, listed_job, running_stack

NAME = "rs-restore"
ASKED_MIN = 600  # -t 10:00:00
CONFIG = config_toml(
    QUICK_POLICY,
    {
        "policy.rightsize": {
            "mode": "enforce",
            "memory": False,
            "cpus": False,
            "gpus": False,
            "min_time_limit": "60s",
            "time_round": "60s",
        }
    },
)


def _rightsize_rows(t: Telemetry, job_id: int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = json.loads(t.run("actions", "--json", "--job", str(job_id)))
    return [r for r in reversed(rows) if r["policy"] == "rightsize"]


def _settled(t: Telemetry, job_id: int, kind: str) -> dict[str, Any] | None:
    """The job's rightsize row of ``kind`` once its outcome is no longer ``pending``."""
    return next(
        (r for r in _rightsize_rows(t, job_id) if r["kind"] == kind and r["outcome"] != "pending"),
        None,
    )


@pytest.mark.release
def test_a_job_rightsized_too_short_times_out_and_comes_back_with_its_old_limit(
    slurm_cluster: LabCluster, tmp_path: Path
) -> None:
    with running_stack(slurm_cluster, tmp_path, CONFIG) as t:
        # history: three 4 s runs -> a 1 min limit (4 s * 1.3, at least 1 min)
        history = [t.submit("-J", NAME, "-t", "10:00:00", "--wrap", "sleep 4") for _ in range(3)]

        def finished() -> bool:
            jobs = {j["job_id"]: j for j in json.loads(t.run("jobs", "--json"))}
            return all(jobs.get(h, {}).get("state") == "COMPLETED" for h in history)

        wait_for("three finished runs", finished, timeout_s=120)
        # this run takes 5 min (far longer than its history), 2 s once requeued
        job = t.submit(
            "--hold",
            "--requeue",
            "--comment",
            "sgpu:rightsize",
            "-J",
            NAME,
            "-t",
            "10:00:00",
            "--wrap",
            'if [ "${SLURM_RESTART_COUNT:-0}" -gt 0 ]; then sleep 2; else sleep 300; fi',
        )

        def lowered() -> bool:
            j = listed_job(job)
            return (
                j is not None and j.time_limit is not None and j.time_limit.total_seconds() < 3600
            )

        wait_for("the rightsize update of the held job", lowered, timeout_s=90)
        # an audit row is written "pending" before Slurm is asked and settled after it
        wait_for("the update's audit row to settle", lambda: _settled(t, job, "update"), 30)
        (update,) = [r for r in _rightsize_rows(t, job) if r["kind"] == "update"]
        assert update["outcome"] == "done" and update["fields"]["TimeLimit"] == "00:01:00"
        subprocess.run(["scontrol", "release", str(job)], check=True, timeout=30)

        # killed at 1 min (slurmctld checks limits every 30 s), then requeued
        row = wait_for("the restore of the timed-out job", lambda: _settled(t, job, "requeue"), 240)
        assert row["outcome"] == "done", row
        assert row["fields"]["TimeLimit"] == "10:00:00"
        assert row["numbers"]["time_limit_s"] == 60
        assert row["numbers"]["run_time_s"] >= 60
        back = listed_job(job)
        assert back is not None and back.restart_count >= 1
        assert back.time_limit is not None and back.time_limit.total_seconds() == ASKED_MIN * 60
        assert rightsize_opted_out(back.comment)
        assert "JobHeld" not in back.reason  # released after the update
        # Slurm starts it again after its requeue delay (BeginTime ~121 s); it finishes
        wait_for(
            "the restored job to complete",
            lambda: (j := listed_job(job)) is not None and j.state is JobState.COMPLETED,
            timeout_s=300,
        )
        # not lowered again: its comment says sgpu:norightsize
        assert [r["kind"] for r in _rightsize_rows(t, job)] == ["update", "requeue"]
