"""Rightsizing never costs a job its run, daemon side: a job that ran into a time limit
the daemon lowered is requeued with the limit it had, not lowered again, and its key's
margin grows, across daemon restarts (slurmgpu.policy.limit_restore,
slurmgpu.daemon.limit_restore)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

from slurmgpu.config import Settings
from slurmgpu.daemon.app import Daemon
from slurmgpu.daemon.lease import DaemonLease
from slurmgpu.intent import SetComment, SetTimeLimit
from slurmgpu.model import Job, JobState, Node
from slurmgpu.policy.base import Action, Decision, Mode
from slurmgpu.policy.limit_restore import (
    MAX_RESTORES,
    LimitChanges,
    restore_action,
)
from slurmgpu.policy.priors import Priors
from slurmgpu.store import JobStore, open_store
from slurmgpu.store.audit import AuditStore
from slurmgpu.store.history import HistoryLoader
from slurmgpu.tokens import rightsize_opted_out
from tests.fakes import FakeSlurm
from tests.unit.policy_builders import running_job

HOUR = timedelta(hours=1)
ASKED = LimitChanges(asked_s=8 * 3600.0)
NODES = [Node("gpu1", "mixed", gpus=4, gpus_used=1, partitions=("gpu",), address="127.0.0.1")]


def timed_out(job_id: int = 200, **extra: object) -> Job:
    """A batch job killed at the 80 min limit rightsizing gave it (it asked for 8 h)."""
    now = datetime.now(UTC)
    job = running_job(job_id, started=80 * timedelta(minutes=1), at=now, comment="run 3")
    return replace(
        job,
        state=JobState.TIMEOUT,
        end_time=now,
        time_limit=timedelta(minutes=80),
        requeue=True,
        **extra,  # type: ignore[arg-type]
    )


def test_a_job_killed_at_its_lowered_limit_is_requeued_with_the_one_it_had() -> None:
    a = restore_action(timed_out(), ASKED)
    assert a is not None
    assert (a.policy, a.kind, a.alert, a.protective) == (
        "rightsize",
        "requeue",
        "limit_restore",
        True,
    )
    limit, comment = a.intents
    assert limit == SetTimeLimit(8 * 3600)
    assert isinstance(comment, SetComment) and comment.text == "run 3 sgpu:norightsize"
    assert a.numbers["time_limit_s"] == 80 * 60
    assert a.numbers["run_time_s"] == 80 * 60
    assert (a.numbers["name"], a.numbers["partition"], a.numbers["restores"]) == ("train", "gpu", 1)


def test_only_jobs_whose_lowered_limit_killed_them_are_requeued() -> None:
    job = timed_out()
    assert restore_action(job, None) is None  # the daemon never changed its limit
    assert restore_action(job, LimitChanges(asked_s=80 * 60.0)) is None  # not lowered
    assert restore_action(replace(job, state=JobState.COMPLETED), ASKED) is None
    assert restore_action(replace(job, state=JobState.FAILED), ASKED) is None
    assert restore_action(replace(job, batch=False), ASKED) is None  # salloc: no requeue
    assert restore_action(replace(job, requeue=False), ASKED) is None  # --no-requeue
    assert restore_action(replace(job, array_job_id=190, array_task_id=3), ASKED) is None
    spent = LimitChanges(asked_s=8 * 3600.0, restores=MAX_RESTORES)
    assert restore_action(job, spent) is None
    again = restore_action(job, LimitChanges(asked_s=8 * 3600.0, restores=MAX_RESTORES - 1))
    assert again is not None and again.numbers["restores"] == MAX_RESTORES


def _lowered(store: JobStore, job: Job) -> None:
    """Audit an executed rightsize of ``job``'s limit from 8 h to 80 min, as the actuator
    writes it."""
    audit = AuditStore(store.engine, store.cluster)
    action = Action(
        "rightsize",
        "update",
        job.job_id,
        job.user,
        "3 past runs (user+name+partition) suggest TimeLimit 01:20:00 (was 08:00:00)",
        {"time_limit_current_s": 8 * 3600, "time_limit_proposed_s": 80 * 60},
        (SetTimeLimit(80 * 60),),
        "rightsize",
    )
    (row,) = audit.record(
        [Decision(action, Mode.ENFORCE, execute=True, notify=False)],
        datetime.now(UTC) - 2 * HOUR,
        slurm_version="22.05.8",
    )
    audit.set_outcome(row, "done")


def test_the_daemon_requeues_it_once_and_the_keys_margin_survives_a_restart(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    settings = Settings().with_database(url)
    store = open_store(url)
    job = replace(timed_out(), state=JobState.RUNNING, end_time=None)
    # never lowered: its own row says TIMEOUT
    other = replace(timed_out(201), name="eval", state=JobState.RUNNING, end_time=None)
    _lowered(store, job)
    slurm = FakeSlurm([job, other], NODES)
    lease = DaemonLease(store.engine, ttl=timedelta(seconds=60))
    lease.acquire()
    try:
        daemon = Daemon(settings, store, slurm, lease, poll=timedelta(seconds=30))
        daemon.run_once()  # both running
        assert not [c for c in slurm.calls if c not in {"jobs", "nodes", "finished_jobs"}]
        slurm.set_jobs([timed_out(), replace(timed_out(201), name="eval")])
        daemon.run_once()  # both killed at their limit: only the lowered one goes back
        assert [call for call, _ in slurm.actions] == ["requeuehold", "update", "release"]
        assert all(ref.split()[0] == "200" for _, ref in slurm.actions)
        back = {j.job_id: j for j in slurm.jobs()}[200]
        assert back.state is JobState.PENDING and back.restart_count == 1
        assert back.time_limit == 8 * HOUR
        assert rightsize_opted_out(back.comment)
        (row,) = AuditStore(store.engine, store.cluster).list(job_id=200, policy="rightsize")[:1]
        assert (row.kind, row.outcome, row.fields["TimeLimit"]) == ("requeue", "done", "08:00:00")
        text = daemon.metrics.exposition().decode()
        assert "sgpu_rightsize_limit_restores_total 1.0" in text
        daemon.run_once()  # listed pending now: nothing more
        assert len(slurm.actions) == 3
    finally:
        lease.release()
    # A new daemon (a restart) reads the killed run back: the key counts one timeout.
    history = HistoryLoader(store.engine, store.cluster).load(
        datetime.now(UTC) - 90 * 24 * HOUR, datetime.now(UTC)
    )
    killed = sorted((r for r in history if r.state == "TIMEOUT"), key=lambda r: r.name)
    assert [r.name for r in killed] == ["eval", "train"]  # its own row; the restore's
    record = killed[1]
    assert (record.user, record.name, record.partition) == ("alice", "train", "gpu")
    assert record.run_time == 80 * timedelta(minutes=1)
    priors = Priors.from_history(history, min_samples=1)
    key = priors.answer("alice", "train", "gpu")
    est = priors.key_estimate(key) if key is not None else None
    assert est is not None and est.timeouts == 1
    store.engine.dispose()


def test_a_restore_slurm_refuses_is_audited_failed(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    store = open_store(url)
    job = replace(timed_out(), state=JobState.RUNNING, end_time=None)
    _lowered(store, job)
    slurm = FakeSlurm([job], NODES)
    lease = DaemonLease(store.engine, ttl=timedelta(seconds=60))
    lease.acquire()
    try:
        daemon = Daemon(
            Settings().with_database(url), store, slurm, lease, poll=timedelta(seconds=30)
        )
        daemon.run_once()
        slurm.set_jobs([timed_out()])
        slurm.requeue = _refuse  # type: ignore[method-assign]
        daemon.run_once()
        rows = AuditStore(store.engine, store.cluster).list(job_id=200, policy="rightsize")
        assert rows[0].kind == "requeue" and rows[0].outcome == "failed"
        assert "Requested operation is presently disabled" in (rows[0].error or "")
        assert rows[0].numbers["restores"] == 1
        # no TIMEOUT record from a restore that did not happen (the job's own row has one)
        history = HistoryLoader(store.engine, store.cluster)
        restored = history._restored(datetime.now(UTC) - 24 * HOUR)
        assert restored == []
        # the failed try counts: the audit's restores for the job (of MAX_RESTORES)
        changes = AuditStore(store.engine, store.cluster).limit_changes([200])
        assert changes[200] == LimitChanges(asked_s=8 * 3600.0, restores=0)
    finally:
        lease.release()
        store.engine.dispose()


def _refuse(job_id: str | int, *, hold: bool = False) -> None:
    from slurmgpu.slurm.client import SlurmCommandError

    raise SlurmCommandError(
        f"scontrol requeuehold {job_id}: Requested operation is presently disabled"
    )


def test_a_restore_a_stopped_daemon_left_half_done_leaves_no_job_held(tmp_path: Path) -> None:
    from slurmgpu.actuate.actuator import Actuator

    store = open_store(f"sqlite:///{tmp_path / 's.db'}")
    audit = AuditStore(store.engine, store.cluster)
    action = restore_action(timed_out(), ASKED)
    assert action is not None
    # audited, requeued held, and then the daemon stopped: the row stays pending
    audit.record([Decision(action, Mode.ENFORCE, execute=True, notify=False)], datetime.now(UTC))
    slurm = FakeSlurm([replace(timed_out(), state=JobState.PENDING, restart_count=1)], NODES)
    assert Actuator(slurm, audit).recover() == 1
    # the update again (the limit it had) and the release
    assert [call for call, _ in slurm.actions] == ["update", "release"]
    assert slurm.jobs()[0].time_limit == 8 * HOUR
    store.engine.dispose()
