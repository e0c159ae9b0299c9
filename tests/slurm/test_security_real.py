"""Security on the real local cluster: real MUNGE credentials of root and of an
unprivileged user against the daemon's status API, and `sgpu submit` with shell
metacharacters in a job's name and comment passed to the real sbatch."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from slurmgpu.lab.cluster import LabCluster
from slurmgpu.slurm.cli import CliSlurmClient
from slurmgpu.wire import munge_available, munge_header
from tests.polling import wait_for
from tests.slurm.harness import running_stack
from tests.slurm.status_api import munge_as, status

# Why not the site profile (tests/unit/test_slurm_tier_labs.py)
DEFAULT_LAB = "the stack (harness.running_stack): one agent on each 4-node lab node, gpu1-gpu4"


def test_status_api_shows_users_only_their_own_jobs_with_real_munge(
    slurm_cluster: LabCluster, tmp_path: Path
) -> None:
    if not munge_available():
        pytest.skip("munged is not answering (the lab cluster normally starts it)")
    with running_stack(slurm_cluster, tmp_path) as t:
        job = t.submit("--wrap", "sleep 120")

        def listed() -> dict[str, Any] | None:
            code, reply = status(t, munge_header("status", b""))
            ok = code == 200 and any(j["job_id"] == str(job) for j in reply["jobs"])
            return reply if ok else None

        root_view = wait_for("the daemon to list the job for root", listed, 60)
        assert root_view["admin"] is True and root_view["caller_uid"] == 0
        code, view = status(t, munge_as("nobody"))
        assert code == 200 and view["admin"] is False
        # Only nobody's own jobs (none of this session's tests leaves one), never root's.
        assert all(j["user"] == "nobody" for j in view["jobs"]), view["jobs"]
        assert not any(j["job_id"] == str(job) for j in view["jobs"]), "nobody saw root's job"
        code, reply = status(t, munge_as("nobody"), "?user=root")
        assert code == 403 and "own jobs" in reply["error"]
        # A credential is single use: replaying root's is refused.
        header = munge_header("status", b"")
        assert status(t, header)[0] == 200
        assert status(t, header)[0] == 401


def test_submit_with_shell_metacharacters_in_name_and_comment_runs_no_shell(
    slurm_cluster: LabCluster, tmp_path: Path
) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    name = f"x$(touch {marks}/a);`touch {marks}/b`|touch {marks}/c"
    comment = f"'; touch {marks}/d; echo '"
    with running_stack(slurm_cluster, tmp_path) as t:
        job = t.submit("--hold", "-J", name, "--comment", comment, "--wrap", "true")
        found = next(j for j in CliSlurmClient().jobs() if j.job_id == job)
        assert found.name == name
        assert found.comment == comment
        assert list(marks.iterdir()) == []
        subprocess.run(["scancel", str(job)], check=False, timeout=30)
