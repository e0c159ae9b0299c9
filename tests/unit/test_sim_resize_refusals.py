"""The simulator refuses the resizes the daemon refuses (its executor's rules, now the
same code) and counts the outcome: a refused resize is ``failed``, changes nothing, is
no prior alert and no change for the guardrails."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from slurmgpu.intent import Resize
from slurmgpu.model import ClusterSnapshot, JobState, MalleableSpec
from slurmgpu.policy.base import Action, Decision, Mode, PolicySnapshot
from slurmgpu.policy.engine import PolicyEngine
from slurmgpu.policy.settings import EngineSettings
from slurmgpu.sim.resizes import SimResizes
from slurmgpu.sim.run import ClusterShape, SimOptions, _Runner
from slurmgpu.sim.slurm import SimSlurm
from slurmgpu.sim.workload import MalleableRange, RigidJob, TraceJob


def _refused(spec: TraceJob, to: int, prepare: Callable[[SimSlurm, int], None]) -> str:
    sim = SimSlurm(2, 4, shards_per_gpu=4)
    jid = sim.submit_job(spec)
    prepare(sim, jid)
    sim.run_until(10)
    job = next(j for j in sim.jobs() if j.job_id == jid)
    assert job.state is JobState.RUNNING
    resizes = SimResizes(sim)
    listing = ClusterSnapshot(sim.at(sim.now), tuple(sim.jobs()), tuple(sim.nodes()), sim.version())
    frm = job.allocated_gpus or 1
    action = Action("test", "resize", jid, "alice", "t", intents=(Resize(frm, to),))
    done = resizes.carry_out(
        Decision(action, Mode.ENFORCE, True, True), listing, {jid: MalleableSpec(jid, 1, 8)}
    )
    assert done.outcome == "failed" and done.row is None
    sim.run_until(600)
    assert sim.job(jid).restarts == 0 and not resizes.in_flight
    return done.error or ""


def _job(gpus: int = 2, **kw: object) -> TraceJob:
    return TraceJob(0, "A", "alice", RigidJob(3600, max(gpus, 1)), gpus=gpus, **kw)  # type: ignore[arg-type]


def _nothing(sim: SimSlurm, jid: int) -> None:
    return None


def _no_requeue(sim: SimSlurm, jid: int) -> None:
    sim.job(jid).requeue = False


@pytest.mark.parametrize(
    ("spec", "to", "prepare", "why"),
    [
        (_job(), 12, _nothing, "outside job"),  # out of the 1:8 range
        (_job(), 4, _no_requeue, "--no-requeue"),
        (_job(0, shards=2), 2, _nothing, "at least one GPU"),  # a shard job: no GPU
        (_job(8, gpus_per_node=4), 6, _nothing, "whole number of nodes"),  # 2 nodes of 4
    ],
)
def test_the_simulator_refuses_what_the_daemon_refuses(
    spec: TraceJob, to: int, prepare: Callable[[SimSlurm, int], None], why: str
) -> None:
    assert why in _refused(spec, to, prepare)


class _GrowTooFar:
    """Test-only policy: grow every running job past its malleable range."""

    name = "test_grow"

    def propose(self, snapshot: PolicySnapshot) -> list[Action]:
        return [
            Action(self.name, "resize", j.job_id, j.user, "t", intents=(Resize(2, 8),))
            for j in snapshot.cluster.jobs
            if j.state is JobState.RUNNING
        ]


def test_a_refused_resize_is_failed_and_no_alert() -> None:
    trace = [_job(malleable=MalleableRange(1, 4))]
    engine = PolicyEngine([(_GrowTooFar(), Mode.ENFORCE)], EngineSettings())
    runner = _Runner(trace, ClusterShape(2, 4), "slurm", SimOptions(), None, engine)
    run = runner.run()
    assert run.failed >= 1 and run.executed == 0 and run.resizes == 0
    assert runner.alerts == []  # the daemon's audit counts no failed action as issued
    view = runner.guardrails.view(runner.sim.at(runner.sim.now), EngineSettings().job_cooldown)
    assert view.last_action_at == {}
