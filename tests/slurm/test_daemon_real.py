"""The daemon and `sgpu submit` against the real local Slurm cluster (no mocks).

Each test uses its own database and the `sgpu` command line as a user would, through
``python -m slurmgpu``; jobs are short shell scripts and every wait polls with a deadline.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from slurmgpu.lab.cluster import LabCluster
from slurmgpu.store import JobStore, open_store
from tests.polling import wait_for
from tests.ports import free_port

# Why not the site profile (tests/unit/test_slurm_tier_labs.py)
DEFAULT_LAB = "placements on the 4-node lab's gpu1-gpu4; root's jobs through sgpu jobs"

JOB_SCRIPT = """#!/bin/bash
echo "CVD=${CUDA_VISIBLE_DEVICES:-none} SHARDS=${SLURM_SHARDS_ON_NODE:-0}" \
     "RESTART=${SLURM_RESTART_COUNT:-0}"
sleep ${1:-2}
"""


class Sgpu:
    """Runs the real `sgpu` command with a private database and config."""

    def __init__(self, tmp: Path) -> None:
        self.db = f"sqlite:///{tmp / 'state.db'}"
        self.config = tmp / "config.toml"
        # A free API port: the default 8787 may be a running demo's or another session's.
        self.config.write_text(
            '[slurm]\ncommand_timeout = "5s"\n'
            f'[daemon]\nmax_backoff = "2s"\nlisten = "127.0.0.1:{free_port()}"\n'
        )
        self.env = {**os.environ, "SGPU_DB": self.db, "SGPU_CONFIG": str(self.config)}
        self.tmp = tmp

    def argv(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "slurmgpu", *args]

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            self.argv(*args), env=self.env, capture_output=True, text=True, timeout=120, check=False
        )
        if check and proc.returncode != 0:
            pytest.fail(f"sgpu {' '.join(args)} exited {proc.returncode}: {proc.stderr.strip()}")
        return proc

    def submit(self, *args: str) -> int:
        out = self.run("submit", "--parsable", *args).stdout.strip()
        return int(out.split(";")[0])

    def observe(self) -> None:
        self.run("daemon", "--once")

    def store(self) -> JobStore:
        return open_store(self.db, migrate=False)

    def job(self, job_id: int) -> dict[str, Any] | None:
        rows = json.loads(self.run("jobs", "--json").stdout)
        return next((r for r in rows if r["job_id"] == job_id), None)


@pytest.fixture
def sgpu(slurm_cluster: LabCluster, tmp_path: Path) -> Iterator[Sgpu]:
    tool = Sgpu(tmp_path)
    tool.run("db", "upgrade")
    (tmp_path / "job.sh").write_text(JOB_SCRIPT)
    yield tool
    subprocess.run(["scancel", "--user", "root"], check=False, timeout=30)


def _out(path: Path) -> str | None:
    return path.read_text() if path.exists() and path.read_text().strip() else None


def test_two_gpu_job_is_recorded_with_its_node_gpu_indices_and_end(sgpu: Sgpu) -> None:
    out = sgpu.tmp / "two.out"
    # 30 s: long enough for a daemon cycle (`sgpu daemon --once`) to see it running on a
    # loaded machine; at 4 s the full run once saw only its end and timed out.
    job_id = sgpu.submit(
        "--gres=gpu:2", "-J", "two-gpu", "-o", str(out), str(sgpu.tmp / "job.sh"), "30"
    )
    line = wait_for("the job's output", lambda: _out(out))
    devices = line.split()[0].removeprefix("CVD=").split(",")
    assert len(devices) == 2

    def running() -> dict[str, Any] | None:
        sgpu.observe()
        job = sgpu.job(job_id)
        return job if job and job["state"] == "RUNNING" else None

    job = wait_for("the daemon to record the job running", running)
    (alloc,) = job["gpu_allocations"]
    assert alloc["node"] in {"gpu1", "gpu2", "gpu3", "gpu4"}
    assert len(alloc["gpus"]) == 2
    assert job["gpus_requested"] == 2
    assert job["nodes"] == [alloc["node"]]

    def finished() -> dict[str, Any] | None:
        sgpu.observe()
        job = sgpu.job(job_id)
        return job if job and job["state"] == "COMPLETED" else None

    done = wait_for("the daemon to record the job completed", finished)
    assert done["start_time"] is not None
    assert done["end_time"] is not None
    assert done["end_time"] >= done["start_time"]
    assert done["exit_code"] == 0
    kinds = [(e["kind"], e["to_state"]) for e in sgpu.store().events(job_id)]
    assert kinds[0][0] == "submitted"
    assert ("state", "COMPLETED") in kinds
    # it asked slurmgpu for nothing (no sgpu: token): no submission record
    assert sgpu.store().submissions(job_id) == []


def test_gpus_per_node_and_shard_jobs_are_recorded_with_their_counts(sgpu: Sgpu) -> None:
    script = str(sgpu.tmp / "job.sh")
    # Long enough to be seen running together on a loaded machine; cancelled below.
    per_node = sgpu.submit("--gpus-per-node=1", "-o", "/dev/null", script, "120")
    shard = sgpu.submit("--gres=shard:2", "-o", "/dev/null", script, "120")

    def both_running() -> tuple[dict[str, Any], dict[str, Any]] | None:
        sgpu.observe()
        a, b = sgpu.job(per_node), sgpu.job(shard)
        if a and b and a["state"] == b["state"] == "RUNNING":
            return a, b
        return None

    try:
        a, b = wait_for("both jobs running", both_running)
    finally:
        subprocess.run(["scancel", str(per_node), str(shard)], check=False, timeout=30)
    assert a["gpus_requested"] == 1
    assert len(a["gpu_allocations"][0]["gpus"]) == 1
    assert b["gpus_requested"] == 0
    assert b["shards_requested"] == 2
    assert b["gpu_allocations"][0]["shards"] == 2
    assert len(b["gpu_allocations"][0]["shard_gpus"]) == 1


def test_scontrol_requeue_is_a_requeue_event_of_the_same_job(sgpu: Sgpu) -> None:
    job_id = sgpu.submit(
        "--requeue", "--gres=gpu:1", "-o", "/dev/null", str(sgpu.tmp / "job.sh"), "60"
    )

    def running() -> bool:
        sgpu.observe()
        job = sgpu.job(job_id)
        return bool(job and job["state"] == "RUNNING")

    wait_for("the job running", running)
    subprocess.run(["scontrol", "requeue", str(job_id)], check=True, timeout=30)

    def requeued() -> list[dict[str, Any]] | None:
        sgpu.observe()
        events = sgpu.store().events(job_id)
        return events if any(e["kind"] == "requeue" for e in events) else None

    events = wait_for("a requeue event", requeued)
    (event,) = [e for e in events if e["kind"] == "requeue"]
    assert event["from_state"] == "RUNNING"
    assert event["restart_count"] >= 1
    rows = sgpu.store().jobs(job_ids=[job_id])
    assert len(rows) == 1, "a requeue must not create a second job"
    assert rows[0].job.restart_count >= 1


def test_daemon_survives_slurmctld_outage_and_marks_no_job_gone(
    sgpu: Sgpu, slurm_cluster: LabCluster
) -> None:
    script = str(sgpu.tmp / "job.sh")
    running = sgpu.submit("--gres=gpu:1", "-o", "/dev/null", script, "120")
    pending = sgpu.submit("-N", "4", "--gres=gpu:4", "--begin=now+1hour", "-o", "/dev/null", script)
    log = (sgpu.tmp / "daemon.log").open("w")
    daemon = subprocess.Popen(
        sgpu.argv("daemon", "--interval", "1s"), env=sgpu.env, stdout=log, stderr=subprocess.STDOUT
    )
    log_path = sgpu.tmp / "daemon.log"
    try:
        wait_for("the daemon to see both jobs", lambda: sgpu.job(running) and sgpu.job(pending))
        slurm_cluster.stop_ctld()
        try:
            wait_for(
                "the daemon to log that Slurm is unavailable",
                lambda: "slurm unavailable" in log_path.read_text(),
                timeout_s=90,
            )
            assert daemon.poll() is None, "the daemon must keep running while slurmctld is down"
        finally:
            slurm_cluster.start_ctld()
        wait_for(
            "the daemon to recover",
            lambda: "slurm reachable again" in log_path.read_text(),
            timeout_s=120,
        )
        assert daemon.poll() is None
    finally:
        daemon.terminate()
        code = daemon.wait(timeout=60)
        log.close()
    assert code == 0, "SIGTERM must stop the daemon cleanly"
    text = log_path.read_text()
    assert "Traceback" not in text
    failure_lines = [line for line in text.splitlines() if "slurm unavailable" in line]
    assert all("retrying in" in line for line in failure_lines)
    for job_id in (running, pending):
        (row,) = sgpu.store().jobs(job_ids=[job_id])
        assert not row.gone
        assert all(e["kind"] not in {"gone", "vanished"} for e in sgpu.store().events(job_id))


def test_daemon_once_with_slurmctld_down_is_one_error_line_and_exit_5(
    sgpu: Sgpu, slurm_cluster: LabCluster
) -> None:
    slurm_cluster.stop_ctld()
    try:
        proc = sgpu.run("daemon", "--once", check=False)
    finally:
        slurm_cluster.start_ctld()
    assert proc.returncode == 5
    errors = [line for line in proc.stderr.splitlines() if line.startswith("sgpu:")]
    assert len(errors) == 1
    assert "unavailable" in errors[0]
    assert "Traceback" not in proc.stderr
