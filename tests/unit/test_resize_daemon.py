"""The daemon's policy step carries resize decisions through the resize transaction:
specs come from the comment token and the recorded submission, the decision is audited
and linked to its transaction, the snapshot shows what is in flight, and a job that did
not opt in is never signalled."""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import select

from slurmgpu.actuate.actuator import Actuator
from slurmgpu.actuate.malleable import MalleableActuator
from slurmgpu.daemon.malleable import MalleableDirectory
from slurmgpu.daemon.policy_cycle import PolicyCycle
from slurmgpu.elastic.checkpoint import write_atomic
from slurmgpu.elastic.spec import Ack
from slurmgpu.model import ClusterSnapshot
from slurmgpu.policy.base import Action, Mode, PolicySnapshot, resize_action
from slurmgpu.policy.engine import PolicyEngine
from slurmgpu.policy.settings import EngineSettings
from slurmgpu.store import JobStore, schema
from slurmgpu.store.audit import AuditStore
from slurmgpu.store.transactions import TransactionStore
from slurmgpu.store.usage import UsageStore
from tests.unit.resize_cluster import ResizeSlurm, gpu_job


class ShrinkEverything:
    """A stand-in policy: shrink every running 4-GPU job to 2 (malleable or not)."""

    name = "malleable"

    def __init__(self) -> None:
        self.seen: list[PolicySnapshot] = []

    def propose(self, snapshot: PolicySnapshot) -> Iterable[Action]:
        self.seen.append(snapshot)
        for job in snapshot.jobs():
            if job.job_id not in snapshot.resizing and job.allocated_gpus == 4:
                yield resize_action(self.name, job, 4, 2, "a rigid job waits")


def test_resize_decisions_start_transactions_only_for_opted_in_jobs(
    tmp_path: Path, store: JobStore
) -> None:
    now = datetime.now(UTC)
    store.record_submission(
        7,
        at=now,
        uid=0,
        user="alice",
        cwd=str(tmp_path),
        argv=["x"],
        malleable=(2, 4),
        checkpoint_signal="USR1",
        checkpoint_grace_s=45,
        hints={"elastic_dir": str(tmp_path)},
    )
    slurm = ResizeSlurm([gpu_job(7), gpu_job(8, comment="")])
    audit = AuditStore(store.engine)
    policy = ShrinkEverything()
    engine = PolicyEngine([(policy, Mode.ENFORCE)], EngineSettings(exempt_users=frozenset()))
    malleable = MalleableActuator(slurm, TransactionStore(store.engine), audit)
    cycle = PolicyCycle(
        engine,
        UsageStore(store.engine),
        audit,
        Actuator(slurm, audit),
        malleable=malleable,
        directory=MalleableDirectory(store),
    )

    def snap(at: datetime) -> ClusterSnapshot:
        return ClusterSnapshot(at, tuple(slurm.jobs()), (), "22.05.8")

    results = cycle.run(snap(now), now)
    assert {(r.decision.action.job_id, r.outcome) for r in results} == {(7, "done"), (8, "failed")}
    failed = next(r for r in results if r.decision.action.job_id == 8)
    assert "not malleable" in (failed.error or "")
    assert slurm.log == [("signal", "7", "USR1")]  # job 8 never signalled
    spec = policy.seen[0].malleable[7]
    assert (spec.min_gpus, spec.max_gpus, spec.checkpoint_grace) == (2, 4, timedelta(seconds=45))
    assert 8 not in policy.seen[0].malleable
    with store.engine.connect() as conn:
        linked = conn.execute(
            select(schema.actions.c.transaction_id).where(schema.actions.c.job_id == 7)
        ).scalar_one()
    assert linked is not None
    assert cycle.busy()

    ack = Ack(7, 1, 0, 12, 4, 0.0)
    write_atomic(tmp_path / "7" / "ack.json", json.dumps(ack.to_json()).encode())
    later = now + timedelta(seconds=2)
    cycle.run(snap(later), later)
    assert policy.seen[-1].resizing == frozenset({7})  # the policy sees it in flight
    assert [c for c, _, _ in slurm.log] == ["signal", "requeuehold"]
    slurm.settle()
    cycle.run(snap(later + timedelta(seconds=1)), later + timedelta(seconds=1))  # update
    cycle.run(snap(later + timedelta(seconds=3)), later + timedelta(seconds=3))  # release
    slurm.schedule(later)
    done = later + timedelta(seconds=4)
    cycle.run(snap(done), done)
    assert not cycle.busy()
    assert slurm.job(7).allocated_gpus == 2
    assert policy.seen[-1].resize_cost is not None
    assert 7 in policy.seen[-1].last_resize_at
