"""One cycle, two wirings: the same scenario decided through the shared cycle
(``cycle.core.PolicyCycle``) with the simulator's sources and executor (SimSlurm, the
runner's in-memory alerts and guardrail records) and with the daemon's (SQLite audit and
store in a tmp dir, the Actuator on the in-memory FakeSlurm, records seeded from the
audit) gives the same decisions, cycle by cycle.

The scenario: two idle jobs of one user and a busy one of another on one 4-GPU node,
under the idle-GPU policy in enforce mode with a rate limit of one change per user per
hour, so warnings (prior alerts), a requeue (the executor), the cooldown and the
per-user limit (the guardrail records) all shape the decisions. The simulator runs
first; the daemon is then fed each cycle's listing, at its time, with the usage the
simulator derived for it (the one source that differs by nature: agents' samples in the
store vs the workload model).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from slurmgpu.actuate.actuator import Actuator
from slurmgpu.daemon.policy_cycle import PolicyCycle
from slurmgpu.model import ClusterSnapshot
from slurmgpu.policy.base import Decision, JobUsage, Mode, PolicySnapshot
from slurmgpu.policy.engine import PolicyEngine
from slurmgpu.policy.idle import IdleGpuPolicy
from slurmgpu.policy.settings import EngineSettings, IdleGpuSettings
from slurmgpu.sim.run import ClusterShape, SimOptions, simulate
from slurmgpu.sim.workload import RigidJob, TraceJob
from slurmgpu.store import JobStore
from slurmgpu.store.audit import AuditStore
from slurmgpu.store.usage import UsageStore
from tests.fakes import FakeSlurm

Seen = tuple[datetime, ClusterSnapshot, dict[int, JobUsage], list[Decision]]


class RecordingEngine(PolicyEngine):
    """The real engine; every decide() is kept with what it saw."""

    def __init__(self) -> None:
        idle = IdleGpuSettings(mode=Mode.ENFORCE)
        super().__init__(
            [(IdleGpuPolicy(idle), Mode.ENFORCE)],
            EngineSettings(max_actions_per_user_per_hour=1),
        )
        self.seen: list[Seen] = []

    def decide(self, snapshot: PolicySnapshot) -> list[Decision]:
        out = super().decide(snapshot)
        self.seen.append((snapshot.at, snapshot.cluster, dict(snapshot.usage), out))
        return out


class ReplayedUsage(PolicyCycle):
    """The daemon's wiring, with each cycle's usage as the simulator derived it."""

    by_at: dict[datetime, dict[int, JobUsage]]

    def job_usage(self, cluster: ClusterSnapshot, at: datetime) -> dict[int, JobUsage]:
        return self.by_at[at]


def _job(submit_s: float, name: str, user: str, hours: float, gpus: int, util: float) -> TraceJob:
    return TraceJob(
        submit_s=submit_s,
        name=name,
        user=user,
        model=RigidJob(hours * 3600, gpus, util_pct=util),
        gpus=gpus,
        time_limit_s=10 * 3600,
    )


def _key(decisions: Sequence[Decision]) -> list[tuple[object, ...]]:
    return [
        (
            d.action.policy,
            d.action.kind,
            d.action.job_id,
            d.action.intents,
            d.execute,
            d.notify,
            d.suppressed,
        )
        for d in decisions
    ]


def test_the_daemon_and_the_simulator_decide_alike_through_the_shared_cycle(
    store: JobStore,
) -> None:
    trace = [
        _job(0, "idle-a", "alice", 5, 1, 0.0),
        _job(0, "busy", "bob", 3, 1, 90.0),
        _job(120, "idle-b", "alice", 5, 2, 0.0),
    ]
    sim_engine = RecordingEngine()
    # Idle jobs requeued restart idle: the run is cut after 5 h of virtual time.
    options = SimOptions(max_virtual_s=5 * 3600.0)
    run = simulate(trace, ClusterShape(1, 4, 0), "idle", options, engine=sim_engine)
    assert run.executed >= 1, "the scenario must act (requeue) for the check to mean much"

    audit = AuditStore(store.engine)
    slurm = FakeSlurm()
    daemon_engine = RecordingEngine()
    daemon = ReplayedUsage(daemon_engine, UsageStore(store.engine), audit, Actuator(slurm, audit))
    daemon.by_at = {at: usage for at, _, usage, _ in sim_engine.seen}
    for at, cluster, _, _ in sim_engine.seen:
        slurm.set_jobs(cluster.jobs)
        daemon.run(cluster, at)

    assert len(daemon_engine.seen) == len(sim_engine.seen)
    kinds: set[tuple[str, bool, str]] = set()
    for (at, _, _, sim_out), (_, _, _, daemon_out) in zip(
        sim_engine.seen, daemon_engine.seen, strict=True
    ):
        assert _key(daemon_out) == _key(sim_out), f"decisions differ at {at}"
        kinds |= {(d.action.kind, d.execute, d.suppressed.split(":")[0]) for d in sim_out}
    # What the comparison covered: warnings, an executed requeue, and a requeue held back
    # by a guardrail (the per-user limit or the cooldown).
    assert ("warn", False, "") in kinds or ("warn", True, "") in kinds, kinds
    assert ("requeue", True, "") in kinds, kinds
    assert any(k == "requeue" and not ex and why for k, ex, why in kinds), kinds
    # The daemon's audit holds what it executed: one requeue per executed decision.
    done = [r for r in audit.list() if r.kind == "requeue" and r.outcome == "done"]
    assert len(done) == run.executed
    assert daemon.guardrails.view(
        sim_engine.seen[-1][0], timedelta(hours=1)
    ).user_actions_last_hour.keys() <= {"alice"}
