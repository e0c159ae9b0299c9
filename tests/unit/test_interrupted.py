"""Decisions interrupted by a daemon kill are judged against Slurm after the restart.

The daemon is "killed" (an exception no code catches, like SIGKILL) right after the audit
insert or right after the Slurm call, on a real SQLite store with the in-memory Slurm
fake. The next daemon's Actuator must record ``done`` ("taken (confirmed after
restart)") when Slurm shows the change and ``failed`` ("not applied") when it does not,
and the next cycle must then neither repeat a confirmed change nor skip a missing one.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from slurmgpu.actuate.actuator import Actuator
from slurmgpu.actuate.confirm import Verdict, judge
from slurmgpu.daemon.policy_cycle import PolicyCycle
from slurmgpu.intent import SetTimeLimit
from slurmgpu.model import ClusterSnapshot, GpuRequest, Job, JobState
from slurmgpu.policy.base import Action, Decision, Mode
from slurmgpu.policy.engine import PolicyEngine
from slurmgpu.policy.idle import IdleGpuPolicy
from slurmgpu.policy.settings import EngineSettings, IdleGpuSettings
from slurmgpu.slurm.client import SlurmError, SlurmUnavailableError
from slurmgpu.slurm.parse import parse_time_limit
from slurmgpu.store import JobStore
from slurmgpu.store.audit import AuditStore
from slurmgpu.store.usage import UsageStore
from tests.fakes import FakeSlurm
from tests.unit.policy_world import T0, World, running_job


class Killed(BaseException):
    """Ends the "daemon" where it is; nothing in slurmgpu catches a BaseException."""


class KilledActuator(Actuator):
    """Dies before (``after_record``) or after (``after_execute``) the Slurm call."""

    def __init__(self, slurm: FakeSlurm, audit: AuditStore, point: str) -> None:
        super().__init__(slurm, audit)
        self.point = point

    def _execute(self, action: Action) -> None:
        if self.point == "after_record":
            raise Killed
        super()._execute(action)
        raise Killed


def pending_job(job_id: int, limit: timedelta = timedelta(hours=10)) -> Job:
    return Job(
        job_id=job_id,
        name="rs",
        user="bob",
        state=JobState.PENDING,
        submit_time=T0 - timedelta(minutes=5),
        time_limit=limit,
        cpus=2,
        node_count=1,
        gpus=GpuRequest(gpus=1, per_node=1, sources=("tres_per_node",)),
    )


def update_decision(job_id: int, limit: str) -> Decision:
    action = Action(
        "rightsize",
        "update",
        job_id,
        "bob",
        "shorter",
        intents=(SetTimeLimit.of(parse_time_limit(limit)),),
    )
    return Decision(action, Mode.ENFORCE, execute=True, notify=True)


# --------------------------------------------------------------------------- judge


def test_judge_reads_each_kind_of_change_off_the_listing() -> None:
    at = T0
    run = running_job(1)
    requeued = replace(run, state=JobState.PENDING, restart_count=1, start_time=None)
    restarted = replace(run, restart_count=1, start_time=at + timedelta(minutes=3))
    assert judge("requeue", {}, at, requeued)[0] is Verdict.TAKEN
    assert judge("requeue", {}, at, restarted)[0] is Verdict.TAKEN
    assert judge("requeue", {}, at, run) == (Verdict.NOT_APPLIED, "restart count 0, still RUNNING")
    # Requeued by someone earlier, but still in the run the decision saw: not this requeue.
    assert judge("requeue", {}, at, replace(run, restart_count=2))[0] is Verdict.NOT_APPLIED
    ended = replace(run, state=JobState.COMPLETED)
    assert judge("requeue", {}, at, ended)[0] is Verdict.NOT_CONFIRMED
    assert judge("cancel", {}, at, replace(run, state=JobState.CANCELLED))[0] is Verdict.TAKEN
    assert judge("cancel", {}, at, run)[0] is Verdict.NOT_APPLIED
    assert judge("cancel", {}, at, ended)[0] is Verdict.NOT_CONFIRMED
    assert judge("warn", {}, at, run)[0] is Verdict.NOT_CONFIRMED
    assert judge("requeue", {}, at, None)[0] is Verdict.NOT_CONFIRMED
    assert judge("resize", {"from_gpus": "4", "to_gpus": "2"}, at, run)[0] is Verdict.NOT_CONFIRMED

    job = pending_job(2, timedelta(hours=2))
    assert judge("update", {"TimeLimit": "02:00:00"}, at, job) == (
        Verdict.TAKEN,
        "TimeLimit in place",
    )
    assert judge("update", {"TimeLimit": "1:30:00"}, at, job) == (
        Verdict.NOT_APPLIED,
        "TimeLimit 02:00:00",
    )
    both = {"TimeLimit": "02:00:00", "NumCPUs": "2", "TresPerNode": "gres/gpu:1"}
    assert judge("update", both, at, job)[0] is Verdict.TAKEN
    # One field in place and one not: the update (one scontrol call) did not happen.
    assert judge("update", {**both, "NumCPUs": "8"}, at, job)[0] is Verdict.NOT_APPLIED
    assert judge("update", {"TresPerNode": "gres:gpu:a100:2"}, at, job) == (
        Verdict.NOT_APPLIED,
        "TresPerNode gpu 1",
    )
    # Fields the listing does not show cannot confirm anything.
    assert judge("update", {"MinCPUsNode": "2"}, at, job)[0] is Verdict.NOT_CONFIRMED
    assert judge("update", {"TimeLimit": "soon"}, at, job)[0] is Verdict.NOT_CONFIRMED


# --------------------------------------------------------------------------- restarts


def _idle_until_requeue(w: World, job: Job) -> datetime:
    """Drive the idle policy to the cycle that requeues ``job``; return that cycle's time."""
    w.samples(job, T0 - timedelta(minutes=130), T0, 0.0)
    w.run([job], T0)
    w.samples(job, T0 + timedelta(minutes=1), T0 + timedelta(minutes=16), 0.0)
    w.run([job], T0 + timedelta(minutes=16))
    w.samples(job, T0 + timedelta(minutes=17), T0 + timedelta(minutes=32), 0.0)
    return T0 + timedelta(minutes=32)


def _restart(w: World) -> Actuator:
    """A new daemon on the same store and Slurm: a fresh Actuator, recovered, and a cycle."""
    actuator = Actuator(w.slurm, w.audit)
    actuator.recover()
    settings = IdleGpuSettings(mode=Mode.ENFORCE)
    engine = PolicyEngine([(IdleGpuPolicy(settings), Mode.ENFORCE)], EngineSettings())
    w.cycle = PolicyCycle(engine, w.usage, w.audit, actuator)
    return actuator


@pytest.mark.parametrize("point", ["after_record", "after_execute"])
def test_interrupted_requeue_is_confirmed_or_redone_once(
    tmp_path: Path, point: str, caplog: pytest.LogCaptureFixture
) -> None:
    w = World(tmp_path, Mode.ENFORCE)
    job = running_job(1)
    at = _idle_until_requeue(w, job)
    w.cycle.actuator = KilledActuator(w.slurm, w.audit, point)
    with pytest.raises(Killed):
        w.run([job], at)
    assert w.alerts(1)[-1] == ("requeue", "pending")

    caplog.set_level(logging.WARNING, "slurmgpu.actuate")
    _restart(w)
    (row,) = [r for r in w.audit.list(job_id=1) if r.kind == "requeue"]
    if point == "after_execute":
        assert row.outcome == "done", row
        assert row.error == "interrupted; taken (confirmed after restart): restart count 1, PENDING"
    else:
        assert row.outcome == "failed", row
        assert row.error == (
            "interrupted; not applied (checked after restart): restart count 0, still RUNNING"
        )
    line = [m for m in caplog.messages if "interrupted by a daemon stop" in m]
    assert len(line) == 1, caplog.messages
    taken = 1 if point == "after_execute" else 0
    assert f"{taken} taken (confirmed), {1 - taken} not applied, 0 not confirmed" in line[0]

    # The next cycles: the requeue happens exactly once in all.
    for minutes in (33, 34, 40):
        (now,) = w.slurm.jobs()
        w.samples(job, at, at + timedelta(minutes=minutes - 32), 0.0)
        w.run([now], T0 + timedelta(minutes=minutes))
    (final,) = w.slurm.jobs()
    assert final.restart_count == 1
    requeues = [r for r in w.audit.list(job_id=1) if r.kind == "requeue"]
    assert [r.outcome for r in requeues].count("done") == 1, requeues


def _changed_since(audit: AuditStore, since: datetime) -> dict[int | None, datetime]:
    """Job → its newest change the daemon's guardrails are seeded with."""
    return {t.job_id: t.at for t in audit.taken_since(since)}


@pytest.mark.parametrize("point", ["after_record", "after_execute"])
def test_interrupted_time_limit_update_is_judged_by_the_new_limit(
    store: JobStore, point: str
) -> None:
    audit = AuditStore(store.engine)
    slurm = FakeSlurm([pending_job(7)])
    with pytest.raises(Killed):
        KilledActuator(slurm, audit, point).carry_out([update_decision(7, "02:00:00")], T0)
    assert Actuator(slurm, audit).recover() == 1
    (row,) = audit.list(job_id=7)
    if point == "after_execute":
        assert (row.outcome, row.error) == (
            "done",
            "interrupted; taken (confirmed after restart): TimeLimit in place",
        )
        assert _changed_since(audit, T0 - timedelta(minutes=1)) == {7: T0}  # cooldown
    else:
        assert (row.outcome, row.error) == (
            "failed",
            "interrupted; not applied (checked after restart): TimeLimit 10:00:00",
        )
        assert _changed_since(audit, T0 - timedelta(minutes=1)) == {}
        # never sent, so not a refusal: the next daemon may redo it at once
        assert audit.failed_since(T0 - timedelta(minutes=1)) == []
    assert len(slurm.updates) == (1 if point == "after_execute" else 0)  # never replayed


def test_a_change_slurm_refused_seeds_the_next_daemons_retry_hold(store: JobStore) -> None:
    audit = AuditStore(store.engine)
    slurm = FakeSlurm([pending_job(7)])
    slurm.update_fails_with = SlurmError("Invalid generic resource (gres) specification")
    (result,) = Actuator(slurm, audit).carry_out([update_decision(7, "02:00:00")], T0)
    assert result.outcome == "failed"
    (refused,) = audit.failed_since(T0 - timedelta(minutes=1))
    assert (refused.job_id, refused.at) == (7, T0)
    assert audit.failed_since(T0 + timedelta(minutes=1)) == []


def test_slurm_down_at_restart_leaves_them_pending_until_the_first_listing(
    store: JobStore, caplog: pytest.LogCaptureFixture
) -> None:
    audit = AuditStore(store.engine)
    slurm = FakeSlurm([pending_job(7), running_job(8)])
    warn = Decision(
        Action("idle_gpu", "warn", 8, "alice", "idle", alert="idle_gpu_warning"),
        Mode.ENFORCE,
        execute=True,
        notify=True,
    )
    audit.record([warn], T0)  # killed right after the audit insert
    with pytest.raises(Killed):
        KilledActuator(slurm, audit, "after_execute").carry_out(
            [update_decision(7, "02:00:00")], T0
        )
    slurm.fail_with = SlurmUnavailableError("slurmctld is down")
    caplog.set_level(logging.WARNING, "slurmgpu.actuate")
    actuator = Actuator(slurm, audit)
    assert actuator.recover() == 2
    assert [r.outcome for r in audit.list()] == ["pending", "pending"]
    assert any("checked against the first listing" in m for m in caplog.messages)

    slurm.fail_with = None
    engine = PolicyEngine([], EngineSettings())
    cycle = PolicyCycle(engine, UsageStore(store.engine), audit, actuator)
    jobs = slurm.jobs()
    cycle.run(ClusterSnapshot(taken_at=T0, jobs=tuple(jobs), nodes=()), T0 + timedelta(minutes=1))
    by_job = {r.job_id: (r.outcome, r.error) for r in audit.list()}
    assert by_job[7] == ("done", "interrupted; taken (confirmed after restart): TimeLimit in place")
    assert by_job[8] == (
        "failed",
        "interrupted: the daemon stopped; not confirmed: a warning leaves nothing in Slurm "
        "to check",
    )
    assert actuator.settle_interrupted(jobs) == 0  # settled once


def test_a_job_gone_from_slurm_is_not_confirmed_either_way(store: JobStore) -> None:
    audit = AuditStore(store.engine)
    audit.record([update_decision(9, "01:00:00")], datetime.now(UTC))
    Actuator(FakeSlurm([]), audit).recover()
    (row,) = audit.list()
    assert row.outcome == "failed"
    assert row.error == (
        "interrupted: the daemon stopped; not confirmed: the job is no longer in Slurm's listing"
    )
