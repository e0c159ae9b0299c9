"""A site user's ``sgpu submit`` is recorded, by the daemon, from Slurm's view of the job
(slurmgpu/store/submission_record.py), on the site-profile lab: the daemon runs as its
own user (coordinator of ``root``, no AdminLevel) on a database only it can read; the
users cannot open it.

- ``sgpu submit --malleable`` as ``sgpu-u1`` says nothing of the store (it once printed
  "submitted but not recorded: ... Permission denied"); the daemon's first cycle records
  the submission with the uid, user and work directory Slurm has, and the checkpoint
  options of the comment, and the daemon resizes the job with those options (they once
  stayed behind with the record, and a user's job was resized with USR2 and 120 s).
- Another user can neither record nor alter it: ``sgpu-u2`` cannot open the store nor
  change the job's comment (Slurm refuses), and a job of ``sgpu-u2``'s is recorded as
  ``sgpu-u2``'s; the owner's own later edit of the comment does not alter the record.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from slurmgpu.daemon.malleable import MalleableDirectory
from slurmgpu.lab.cluster import site
from slurmgpu.model import ClusterSnapshot
from slurmgpu.slurm.cli import CliSlurmClient
from slurmgpu.store import open_store
from tests.slurm.site_users import SiteWork, as_user, job_fields

pytestmark = pytest.mark.release  # the site profile on every release

OWNER, OTHER = site.USERS[0], site.USERS[1]


def test_a_users_submission_is_recorded_and_no_one_else_can_alter_it(
    site_work: SiteWork,
) -> None:
    work, python, env = site_work.work, site_work.python, site_work.env
    sgpu = [*python, "-m", "slurmgpu"]

    def daemon_cycle() -> None:
        site_work.daemon_once("--no-policies")

    daemon_cycle()  # creates the database, as the daemon's user
    db = site_work.db
    assert db.stat().st_uid == site.DAEMON_UID and db.stat().st_mode & 0o077 == 0

    submitted = as_user(
        OWNER.name, *sgpu, "submit", "--parsable", "--malleable", "1:2",
        "--checkpoint-signal", "USR1", "--checkpoint-grace", "300s",
        "--elastic-dir", str(work / "state"), "--hold", "-D", str(work),
        "--gres=gpu:1", "-o", "/dev/null", "--wrap", "sleep 300",
        cwd=work, env=env,
    )  # fmt: skip
    assert submitted.returncode == 0, submitted.stderr
    assert "record" not in submitted.stderr and "database" not in submitted.stderr
    job = int(submitted.stdout.strip().split(";")[0])

    daemon_cycle()
    store = open_store(f"sqlite:///{db}", migrate=False)  # read as root, for the test
    (row,) = store.submissions(job)
    assert (row["uid"], row["user"], row["cwd"]) == (OWNER.uid, OWNER.name, str(work))
    assert (row["malleable_min"], row["malleable_max"]) == (1, 2)
    assert (row["checkpoint_signal"], row["checkpoint_grace_s"]) == ("USR1", 300)
    assert row["hints"]["elastic_dir"] == str(work / "state")
    # what the daemon resizes the job with: the user's options, not the defaults
    jobs = CliSlurmClient().jobs()
    snapshot = ClusterSnapshot(taken_at=datetime.now(UTC), jobs=tuple(jobs), nodes=())
    spec = MalleableDirectory(store).specs(snapshot)[job]
    assert (spec.min_gpus, spec.max_gpus, spec.checkpoint_signal) == (1, 2, "USR1")
    assert spec.checkpoint_grace == timedelta(seconds=300)
    assert spec.state_dir == str(work / "state")

    # Another user cannot open the daemon's store...
    opened = as_user(
        OTHER.name, *python, "-c",
        "import sys; from slurmgpu.store import open_store; open_store(sys.argv[1], migrate=False)",
        env["SGPU_DB"], env=env,
    )  # fmt: skip
    assert opened.returncode != 0 and "ermission denied" in opened.stderr, opened.stderr
    # ...nor change what the daemon reads of the job (Slurm refuses)
    comment = job_fields(job)["Comment"]
    altered = as_user(
        OTHER.name, "scontrol", "update", f"jobid={job}", "comment=sgpu:malleable=1:64", env=env
    )
    assert altered.returncode != 0, altered.stdout
    assert job_fields(job)["Comment"] == comment
    # ...and a job of its own is recorded as its own, whatever its comment claims
    theirs = as_user(
        OTHER.name, *sgpu, "submit", "--parsable", "--rightsize", "--hold",
        f"--comment=user={OWNER.name}", "-o", "/dev/null", "--wrap", "true",
        cwd=work, env=env,
    )  # fmt: skip
    assert theirs.returncode == 0, theirs.stderr
    other_job = int(theirs.stdout.strip().split(";")[0])
    # The owner may edit its own comment: the record stays the job as first seen.
    edited = as_user(
        OWNER.name, "scontrol", "update", f"jobid={job}", "comment=sgpu:malleable=1:2", env=env
    )
    assert edited.returncode == 0, edited.stderr

    daemon_cycle()
    (other_row,) = store.submissions(other_job)
    assert (other_row["uid"], other_row["user"]) == (OTHER.uid, OTHER.name)
    assert other_row["hints"] == {"source": "slurm", "rightsize": True}
    assert store.submissions(job) == [row]
