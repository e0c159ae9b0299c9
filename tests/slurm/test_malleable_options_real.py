"""A user's ``sgpu submit --malleable`` options reach the daemon (real Slurm, real user).

``sgpu submit`` run by an unprivileged user cannot write the daemon's root-only store
(and no longer tries), so the checkpoint signal, grace and state directory once stayed
behind and the daemon resized the job with USR2 and 120 s. They now ride in the job's
comment, which the daemon reads for every user's job through squeue.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from slurmgpu.daemon.malleable import MalleableDirectory
from slurmgpu.lab.cluster import LabCluster
from slurmgpu.model import ClusterSnapshot
from slurmgpu.slurm.cli import CliSlurmClient
from slurmgpu.store import open_store

REPO = Path(__file__).resolve().parents[2]
USER = "nobody"


def _python_for(user: str) -> tuple[str, dict[str, str]]:
    """An interpreter ``user`` may run, with this checkout and its packages importable."""
    env = dict(os.environ)
    probe = [sys.executable, "-c", "import slurmgpu"]
    runs = subprocess.run(
        ["runuser", "-u", user, "--", *probe], capture_output=True, check=False, timeout=60
    )
    if runs.returncode == 0:
        return sys.executable, env
    # The venv's interpreter may live under /root (0700): use the system one of the same
    # version with the venv's packages on its path.
    system = f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}"
    site = next(p for p in sys.path if p.endswith("site-packages"))
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), site])
    ok = Path(system).exists() and subprocess.run(
        ["runuser", "-u", user, "--", system, "-c", "import slurmgpu"],
        env=env, capture_output=True, check=False, timeout=60,
    ).returncode == 0  # fmt: skip
    if not ok:
        pytest.skip(f"no Python interpreter that {user} may run imports slurmgpu")
    return system, env


@pytest.fixture
def user_visible(slurm_cluster: LabCluster) -> Iterator[Path]:
    """A work directory the user may enter, and the lab's slurm.conf readable to them."""
    lab_root = Path(slurm_cluster.conf_path).parents[1]
    mode = stat.S_IMODE(lab_root.stat().st_mode)
    lab_root.chmod(mode | 0o011)  # traverse only: the user reads etc/slurm.conf
    work = Path(tempfile.mkdtemp(prefix="sgpu-user-", dir="/tmp"))
    work.chmod(0o777)
    try:
        yield work
    finally:
        lab_root.chmod(mode)
        shutil.rmtree(work, ignore_errors=True)


def test_a_users_checkpoint_options_reach_the_daemon(
    slurm_cluster: LabCluster, user_visible: Path, tmp_path: Path
) -> None:
    python, env = _python_for(USER)
    work = user_visible
    daemon_db = tmp_path / "state.db"
    store = open_store(f"sqlite:///{daemon_db}")
    assert stat.S_IMODE(daemon_db.stat().st_mode) & 0o077 == 0  # root's alone
    env["SGPU_DB"] = f"sqlite:///{daemon_db}"
    proc = subprocess.run(
        ["runuser", "-u", USER, "--", python, "-m", "slurmgpu", "submit",
         "--malleable", "1:2", "--checkpoint-signal", "USR1", "--checkpoint-grace", "300s",
         "--hold", "--gres=gpu:1", "--wrap", "sleep 300"],
        cwd=work, env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    job_id = int(proc.stdout.split()[-1])
    try:
        # The user's sgpu writes nothing to root's store (the daemon records the job
        # when it sees it: tests/slurm/test_site_submission_real.py), and says nothing of it.
        assert store.submissions(job_id) == []
        assert "record" not in proc.stderr
        jobs = CliSlurmClient().jobs()
        found = next(j for j in jobs if j.job_id == job_id)
        assert found.user == USER
        snap = ClusterSnapshot(taken_at=datetime.now(UTC), jobs=tuple(jobs), nodes=())
        spec = MalleableDirectory(store).specs(snap)[job_id]
        assert (spec.min_gpus, spec.max_gpus) == (1, 2)
        assert spec.checkpoint_signal == "USR1"
        assert spec.checkpoint_grace == timedelta(seconds=300)
        assert spec.state_dir == str(work / ".sgpu-elastic")
    finally:
        subprocess.run(["scancel", str(job_id)], check=False, timeout=30)
