"""A resize never lifts a hold the job's user set after the resize released the job.

Real slurmctld, the site-profile lab: the job pending after a resize's release is held
by its user, ``sgpu-u2`` (``sbatch --hold`` leaves the same ``JobHeldUser`` a user's
``scontrol hold`` does); the next step of the resize transaction must leave it held and
close. It used to release it.
"""

from __future__ import annotations

import subprocess
from datetime import UTC, datetime
from pathlib import Path

from slurmgpu.cycle.resize import CLOSED, KIND, OPEN, RELEASED, ResizeExecutor
from slurmgpu.lab.cluster import LabCluster, site
from slurmgpu.model import ClusterSnapshot, Job
from slurmgpu.slurm.cli import CliSlurmClient
from slurmgpu.store import open_store
from slurmgpu.store.transactions import TransactionStore
from tests.slurm.site_users import sbatch_as


def _job(slurm: CliSlurmClient, job_id: int) -> Job:
    return next(j for j in slurm.jobs() if j.job_id == job_id)


def test_a_users_hold_after_the_release_is_left_alone(
    site_cluster: LabCluster, tmp_path: Path
) -> None:
    slurm = CliSlurmClient(timeout_s=20)
    job_id = sbatch_as(site.USERS[1].name, "--hold", "--gres=gpu:1", "--wrap", "sleep 300")
    try:
        assert _job(slurm, job_id).reason == "JobHeldUser"
        store = TransactionStore(open_store(f"sqlite:///{tmp_path / 's.db'}").engine)
        now = datetime.now(UTC)
        row = store.create(
            job_id, KIND, RELEASED, at=now, deadline=None, open_states=OPEN,
            payload={"ref": str(job_id), "from_gpus": 2, "to_gpus": 1, "restart_before": 0},
        )  # fmt: skip
        assert row is not None
        snap = ClusterSnapshot(taken_at=now, jobs=tuple(slurm.jobs()), nodes=())
        ResizeExecutor(slurm, store).advance(snap, now)
        after = _job(slurm, job_id)
        assert after.reason == "JobHeldUser", "the user's hold was lifted"
        (closed,) = store.recent([KIND], job_id=job_id, limit=1)
        assert closed.state in CLOSED and "left held" in (closed.error or "")
    finally:
        subprocess.run(["scancel", str(job_id)], check=False, timeout=30)
