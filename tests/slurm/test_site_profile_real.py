"""The lab's site profile on a real cluster (slurmctld + 16 slurmd, slurmdbd + MariaDB):
its accounts, users and QOS as slurmdbd has them; Slurm's own QOS preemption; every user
seeing and changing only their own jobs with 8 users submitting at once; and the daemon's
Slurm right (coordinator of account ``root``) being enough, where no right is not."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from slurmgpu.lab.cluster import LabCluster, site
from slurmgpu.wire import munge_available
from tests.polling import wait_for
from tests.slurm.harness import running_stack
from tests.slurm.site_users import (
    as_user,
    cancel_all,
    job_fields,
    sbatch_as,
    shared_dir,
    user_python,
)
from tests.slurm.status_api import munge_as, status

# the site profile on every release: scripts/test.sh runs it in each release stage too
pytestmark = pytest.mark.release

USERS = [u.name for u in site.USERS]


@pytest.fixture
def lab(site_cluster: LabCluster) -> Iterator[LabCluster]:
    try:
        yield site_cluster
    finally:
        cancel_all()


def sacctmgr(*args: str) -> list[list[str]]:
    proc = subprocess.run(
        ["sacctmgr", "-n", "-P", *args], capture_output=True, text=True, timeout=30, check=False
    )
    assert proc.returncode == 0, proc.stderr
    return [line.split("|") for line in proc.stdout.splitlines() if line.strip()]


def test_site_profile_has_its_nodes_partitions_accounts_users_and_qos(lab: LabCluster) -> None:
    nodes = subprocess.run(
        ["sinfo", "-h", "-N", "-p", "gpu", "-o", "%N %G %T"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout.split("\n")
    assert len([n for n in nodes if n.strip()]) == 16
    assert all("gpu:4" in n and "shard:16" in n for n in nodes if n.strip())
    parts = subprocess.run(
        ["sinfo", "-h", "-o", "%R %D"], capture_output=True, text=True, timeout=30, check=True
    ).stdout.split()
    assert parts == ["gpu", "16", "debug", str(site.DEBUG_NODES)]

    assoc = sacctmgr("show", "assoc", "format=account,user,qos,defaultqos")
    users = {row[1]: row for row in assoc if row[1] in USERS}
    assert set(users) == set(USERS)
    for user in site.USERS:
        account, _name, qos, default = users[user.name]
        assert account == user.account
        assert set(qos.split(",")) == {"normal", "scavenger"} and default == "normal"
    shares = {
        row[0]: row[1]
        for row in sacctmgr("show", "assoc", "where", "user=", "format=account,fairshare")
    }
    for account, share in site.ACCOUNTS.items():
        assert shares[account] == str(share)

    preempt = {
        row[0]: (row[1], row[2])
        for row in sacctmgr("show", "qos", "format=name,preempt,preemptmode")
    }
    assert preempt["normal"][0] == "scavenger"
    assert preempt["scavenger"][1] == "requeue"
    coords = {
        row[0]: row[1] for row in sacctmgr("show", "account", "withcoord", "format=account,coord")
    }
    # 22.05 lists a sub-account's coordinator once for root and once for itself
    for account in site.COORDINATED.split(","):
        assert set(coords[account].split(",")) == {site.DAEMON_USER}, coords


def test_slurm_requeues_a_scavenger_job_for_a_normal_qos_job(lab: LabCluster) -> None:
    scavenger = sbatch_as(
        "sgpu-u4", "--qos=scavenger", "-w", "gpu16", "--gres=gpu:4", "--wrap", "sleep 600"
    )
    wait_for(
        "the scavenger job running", lambda: job_fields(scavenger).get("JobState") == "RUNNING"
    )
    normal = sbatch_as("sgpu-u1", "-w", "gpu16", "--gres=gpu:1", "--wrap", "sleep 600")

    wait_for("the normal job running", lambda: job_fields(normal).get("JobState") == "RUNNING")

    def requeued() -> dict[str, str] | None:
        fields = job_fields(scavenger)
        return fields if fields.get("JobState") == "PENDING" else None

    preempted = wait_for("the scavenger job requeued", requeued)
    assert int(preempted["Restarts"]) == 1
    assert preempted["QOS"] == "scavenger" and preempted["Account"] == "biology"
    sacct = subprocess.run(
        ["sacct", "-n", "-X", "-D", "-j", str(scavenger), "-o", "state%20"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout.split()
    assert "PREEMPTED" in sacct, sacct


@pytest.fixture
def work() -> Iterator[Path]:
    with shared_dir("sgpu-site-users-") as path:
        yield path


def test_eight_users_at_once_see_and_change_only_their_own_jobs(
    lab: LabCluster, tmp_path: Path, work: Path
) -> None:
    # through `sgpu submit` as each user (in a chroot lab, inside the chroot)
    sgpu = [*user_python(lab, work), "-m", "slurmgpu", "submit"]

    def submit(user: str) -> tuple[str, list[int]]:
        ids = []
        for _ in range(2):
            proc = as_user(
                user,
                *sgpu,
                "--parsable",
                "-o",
                "/dev/null",
                "--gres=gpu:1",
                "--wrap",
                "sleep 300",
                cwd=work,
            )
            assert proc.returncode == 0, f"{sgpu} as {user}: {proc.stderr.strip()}"
            ids.append(int(proc.stdout.strip().split(";")[0]))
        return user, ids

    with ThreadPoolExecutor(max_workers=len(USERS)) as pool:
        owned = dict(pool.map(submit, USERS))
    owner = {job: user for user, jobs in owned.items() for job in jobs}
    assert len(owner) == 2 * len(USERS)
    for job, user in owner.items():
        assert job_fields(job)["UserId"].startswith(f"{user}(")
    wait_for(
        "every user's jobs running",
        lambda: all(job_fields(job).get("JobState") == "RUNNING" for job in owner),
    )

    accounted_owner = {
        int(job): user
        for job, user in (
            line.split("|")
            for line in subprocess.run(
                ["sacct", "-a", "-n", "-X", "-P", "-o", "jobid,user"],
                capture_output=True,
                text=True,
                timeout=30,
                check=True,
            ).stdout.split()
        )
    }
    for i, user in enumerate(USERS):
        mine = set(owned[user])
        seen = as_user(user, "squeue", "-h", "-o", "%i").stdout.split()
        assert {int(j) for j in seen} == mine, f"{user} sees {seen}"

        def all_mine(user: str = user, mine: set[int] = mine) -> set[int] | None:
            out = as_user(user, "sacct", "-a", "-n", "-X", "-o", "jobid").stdout.split()
            listed = {int(j) for j in out}
            return listed if mine <= listed else None

        listed = wait_for(f"{user}'s jobs in sacct", all_mine)
        # other tests' jobs of the same user may be listed too, never another user's
        assert listed & set(owner) == mine, f"{user}'s sacct lists {listed}"
        assert {accounted_owner.get(j, user) for j in listed} == {user}, listed
        other = owned[USERS[(i + 1) % len(USERS)]][0]
        before = job_fields(other)
        for argv in (
            ("scontrol", "update", f"jobid={other}", "nice=100"),
            ("scontrol", "update", f"jobid={other}", "timelimit=5"),
            ("scontrol", "requeuehold", str(other)),
            ("scancel", str(other)),
        ):
            proc = as_user(user, *argv)
            assert proc.returncode != 0 or proc.stderr.strip(), f"{user}: {argv} passed"
        fields = job_fields(other)
        assert fields["JobState"] == "RUNNING" and fields["Restarts"] == "0", fields
        assert (fields["Nice"], fields["TimeLimit"]) == (before["Nice"], before["TimeLimit"])
        # ... and their own job they may change
        own = owned[user][0]
        assert as_user(user, "scontrol", "update", f"jobid={own}", "nice=7").returncode == 0
        assert job_fields(own)["Nice"] == "7"

    # the daemon's user sees every job and changes any; a user without its right does not
    daemon_view = as_user(site.DAEMON_USER, "squeue", "-h", "-o", "%i").stdout.split()
    assert {int(j) for j in daemon_view} == set(owner)
    target = owned["sgpu-u8"][1]
    for argv in (
        ("scontrol", "update", f"jobid={target}", "nice=100000"),
        ("scontrol", "update", f"jobid={target}", "nice=0"),
        ("scontrol", "update", f"jobid={target}", "timelimit=2:00:00"),
        ("scontrol", "requeuehold", str(target)),
        ("scontrol", "release", str(target)),
    ):
        proc = as_user(site.DAEMON_USER, *argv)
        assert proc.returncode == 0, f"{site.DAEMON_USER}: {argv}: {proc.stderr.strip()}"
    moved = job_fields(target)
    assert moved["Restarts"] == "1" and moved["TimeLimit"] == "02:00:00", moved
    assert "Held" not in moved["Reason"], moved

    if not munge_available():
        pytest.skip("munged is not answering: the status API part needs MUNGE")
    with running_stack(lab, tmp_path) as t:
        wait_for(
            "the daemon to list every user's jobs",
            lambda: (
                {int(j["job_id"]) for j in status(t, munge_as("root"))[1].get("jobs", [])}
                >= set(owner)
            ),
            timeout_s=60,
        )
        for user in USERS:
            code, view = status(t, munge_as(user))
            assert code == 200 and view["admin"] is False
            # other tests' jobs of the same user may be listed too, never another user's
            assert {int(j["job_id"]) for j in view["jobs"]} & set(owner) == set(owned[user])
            assert {j["user"] for j in view["jobs"]} == {user}, view["jobs"]
            someone = USERS[1] if user == USERS[0] else USERS[0]
            assert status(t, munge_as(user), f"?user={someone}")[0] == 403


def test_the_daemon_user_needs_its_coordinator_right(lab: LabCluster) -> None:
    """Without coordinator of ``root`` (or an AdminLevel) the daemon's user can do nothing
    to other users' jobs: the right the profile gives is needed, not decoration."""
    job = sbatch_as("sgpu-u5", "--hold", "--wrap", "sleep 60")
    removed = subprocess.run(
        [
            "sacctmgr",
            "-i",
            "remove",
            "coordinator",
            f"account={site.COORDINATED}",
            f"names={site.DAEMON_USER}",
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert removed.returncode == 0, removed.stderr
    try:
        seen = as_user(site.DAEMON_USER, "squeue", "-h", "-o", "%i").stdout.split()
        refused = as_user(site.DAEMON_USER, "scontrol", "release", str(job))
        assert str(job) not in seen
        assert refused.returncode != 0
        assert job_fields(job)["Reason"] == "JobHeldUser"
    finally:
        subprocess.run(
            [
                "sacctmgr",
                "-i",
                "add",
                "coordinator",
                f"account={site.COORDINATED}",
                f"names={site.DAEMON_USER}",
            ],
            capture_output=True,
            timeout=30,
            check=True,
        )
    # slurmctld hears of the restored right from slurmdbd a moment later (26.05)
    wait_for(
        "the daemon's user to release the job again",
        lambda: as_user(site.DAEMON_USER, "scontrol", "release", str(job)).returncode == 0,
        timeout_s=60,
    )
    assert "Held" not in job_fields(job)["Reason"]
