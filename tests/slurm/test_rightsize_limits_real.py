"""Rightsizing respects the site's QOS limits, on the site-profile lab (issue 32, item 3):
the daemon runs as its own user (coordinator of ``root``, no AdminLevel) on a database
only it can write, and lowers a site user's opted-in pending job from its history.

Slurm does not check a coordinator's update against a QOS minimum: with QOS ``normal``
at ``MinTRESPerJob=mem=2048`` the daemon's ``MinMemoryNode`` below it is taken (exit 0)
and the job, released, waits with ``QOSMinMemory`` for ever (22.05; the same for
``cpu=``: ``QOSMinCpuNotSatisfied``, and ``gres/gpu=``: ``BadConstraints``). The daemon's
next cycle gives it back the request it had (memory and time limit), audited, with
``sgpu:norightsize`` so it is not lowered again, and the job runs; the next job of the
same user and name gets its time limit lowered, not its memory.

The past runs are real jobs of the user; their memory peaks (which agents would sample)
are written into the daemon's store by the test, as the summaries of those jobs. In the
``release`` set: it passed on 22.05, 24.11 and 26.05 (2026-12-07).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from slurmgpu.lab.cluster import site
from slurmgpu.store import open_store
from slurmgpu.store.audit import AuditRecord, AuditStore
from slurmgpu.store.usage import UsageStore
from slurmgpu.tokens import rightsize_opted_out
from tests.polling import wait_for
from tests.slurm.site_users import SiteWork, as_user, job_fields, sbatch_as

pytestmark = pytest.mark.release  # the site profile on every release

OWNER = site.USERS[2].name
NAME = "rs-qos-min"
ENFORCE = '[policy.rightsize]\nmode = "enforce"\n'
PEAK_MIB = 300.0  # each past run's memory peak: rightsizing proposes 512 MiB


def _qos_min(value: str) -> None:
    subprocess.run(
        ["sacctmgr", "-i", "modify", "qos", "normal", "set", f"MinTRESPerJob={value}"],
        capture_output=True,
        timeout=30,
        check=True,
    )


@pytest.fixture
def qos_min_memory() -> Iterator[None]:
    _qos_min("mem=2048")
    try:
        yield
    finally:
        _qos_min("mem=-1")


def _comment(job: int) -> str:
    """The job's whole comment (``job_fields`` splits values at spaces)."""
    proc = subprocess.run(
        ["squeue", "-h", "-j", str(job), "-o", "%k"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return proc.stdout.strip()


def _rightsize_rows(work: SiteWork, job: int) -> list[AuditRecord]:
    store = open_store(f"sqlite:///{work.db}", migrate=False)  # read as root, for the test
    try:
        rows = AuditStore(store.engine, store.cluster).list(job_id=job, policy="rightsize")
    finally:
        store.engine.dispose()
    return sorted(rows, key=lambda r: r.id)


def test_a_rightsize_below_the_qos_minimum_is_undone_and_the_job_runs(
    site_work: SiteWork, qos_min_memory: None
) -> None:
    past = [
        sbatch_as(OWNER, "-J", NAME, "--mem=3500M", "-t", "30", "--wrap", "sleep 1")
        for _ in range(3)
    ]
    wait_for(
        "three finished past runs",
        lambda: all(job_fields(j).get("JobState") == "COMPLETED" for j in past),
        timeout_s=90,
    )
    site_work.daemon_once("--no-policies")  # records them (and creates the store)
    store = open_store(f"sqlite:///{site_work.db}", migrate=False)
    try:
        usage = UsageStore(store.engine, store.cluster)
        for j in past:  # what the agents would have sampled: a 300 MiB peak
            summary = {"version": 1, "nodes": {"gpu1": {"host": {"memory_max_mib": PEAK_MIB}}}}
            usage.save_summary(j, summary, datetime.now(UTC))
    finally:
        store.engine.dispose()
    for path in site_work.db.parent.iterdir():  # the store stays the daemon's own
        os.chown(path, site.DAEMON_UID, site.GID)

    job = sbatch_as(
        OWNER, "--hold", "-J", NAME, "--mem=3500M", "-t", "30",
        "--comment", "sgpu:rightsize", "--wrap", "sleep 2",
    )  # fmt: skip
    site_work.daemon_once(config=ENFORCE)
    lowered = job_fields(job)
    # Slurm took the coordinator's update below the QOS minimum
    assert lowered["MinMemoryNode"] == "512M", lowered
    assert lowered["TimeLimit"] == "00:15:00", lowered
    (update,) = _rightsize_rows(site_work, job)
    assert (update.kind, update.outcome) == ("update", "done"), update

    released = as_user(OWNER, "scontrol", "release", str(job))
    assert released.returncode == 0, released.stderr
    stuck = wait_for(
        "the job waiting on the QOS minimum",
        lambda: f if (f := job_fields(job)).get("Reason") == "QOSMinMemory" else None,
        timeout_s=60,
    )
    assert stuck["JobState"] == "PENDING", stuck

    site_work.daemon_once(config=ENFORCE)
    back = job_fields(job)
    assert back["MinMemoryNode"] == "3500M" and back["TimeLimit"] == "00:30:00", back
    assert rightsize_opted_out(_comment(job)), _comment(job)
    wait_for(
        "the job to run with the request it had",
        lambda: job_fields(job).get("JobState") in {"RUNNING", "COMPLETED"},
        timeout_s=90,
    )
    rows = _rightsize_rows(site_work, job)
    assert [(r.kind, r.outcome) for r in rows] == [("update", "done")] * 2, rows
    undo = rows[1]
    assert "QOSMinMemory" in undo.reason and undo.numbers["reason"] == "QOSMinMemory"
    assert undo.fields["MinMemoryNode"] == "3500", undo.fields
    # not lowered again, nor is the next job of its key below the minimum: its time limit
    # only (QOSMinMemory blames the memory)
    second = sbatch_as(
        OWNER, "--hold", "-J", NAME, "--mem=3500M", "-t", "30",
        "--comment", "sgpu:rightsize", "--wrap", "sleep 2",
    )  # fmt: skip
    site_work.daemon_once(config=ENFORCE)
    assert len(_rightsize_rows(site_work, job)) == 2
    kept = job_fields(second)
    assert kept["MinMemoryNode"] == "3500M" and kept["TimeLimit"] == "00:15:00", kept
