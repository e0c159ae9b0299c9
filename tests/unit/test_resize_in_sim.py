"""The daemon's resize executor (``cycle.resize.ResizeExecutor``) on SimSlurm, with the
in-memory transaction store (``cycle.transactions.MemoryTransactions``) and SimSlurm's
checkpoint record as its ack reader (``sim.acks.SimAcks``): the same object type as in
the daemon carries a resize out in virtual time, one observation a second, and the
job's GPU type is kept."""

from __future__ import annotations

from datetime import datetime

from slurmgpu.cycle.resize import ABORTED, KIND, OPEN, RUNNING, ResizeExecutor
from slurmgpu.cycle.transactions import MemoryTransactions
from slurmgpu.model import ClusterSnapshot, Job, MalleableSpec
from slurmgpu.policy.base import resize_action
from slurmgpu.sim.acks import SimAcks
from slurmgpu.sim.slurm import SimSlurm
from slurmgpu.sim.workload import MalleableRange, RigidJob, TraceJob

T = datetime(2024, 1, 1)


def _listing(sim: SimSlurm) -> ClusterSnapshot:
    return ClusterSnapshot(sim.at(sim.now), tuple(sim.jobs()), tuple(sim.nodes()), sim.version())


def _job(sim: SimSlurm, job_id: int) -> Job:
    return next(j for j in sim.jobs() if j.job_id == job_id)


def _typed_sim() -> tuple[SimSlurm, int]:
    sim = SimSlurm(2, 4, node_types=["v100", "a100"])
    spec = TraceJob(
        submit_s=0,
        name="train",
        user="alice",
        model=RigidJob(6 * 3600, 2),
        gpus=2,
        gpu_type="a100",
        malleable=MalleableRange(1, 4),
    )
    job_id = sim.submit_job(spec)
    sim.run_until(10)
    return sim, job_id


def test_the_daemons_resize_executor_grows_a_typed_job_in_simslurm() -> None:
    sim, job_id = _typed_sim()
    job = _job(sim, job_id)
    assert job.allocated_gpus == 2 and job.gpus.gpu_type == "a100"
    store = MemoryTransactions()
    executor = ResizeExecutor(sim, store, acks=SimAcks(sim))
    action = resize_action("malleable", job, 2, 4, "grow")
    spec = MalleableSpec(job_id, 1, 4)
    row = executor.start(
        action, job, spec, at=sim.at(sim.now), slurm_version=sim.version(), to_gpus=4
    )
    assert row.state == "signaled"
    for _ in range(300):  # the daemon observes every second while a resize is in flight
        sim.run_until(sim.now + 1)
        executor.advance(_listing(sim), sim.at(sim.now))
        if not executor.open():
            break
    (done,) = store.in_states([KIND], [RUNNING])
    assert done.payload["running_gpus"] == 4
    grown = sim.job(job_id)
    assert grown.allocated_gpus == 4 and grown.restarts == 1
    assert grown.gpu_type == "a100"  # the typed request survived the update
    assert {sim.nodes()[n].gpu_type for n, _ in grown.alloc} == {"a100"}
    assert "a100" in done.payload["fields"]["TresPerJob"]


def test_no_acknowledgement_in_time_aborts_and_the_job_keeps_running() -> None:
    sim, job_id = _typed_sim()
    job = _job(sim, job_id)
    store = MemoryTransactions()
    never = ResizeExecutor(sim, store, acks=lambda state_dir, job_id: None)
    spec = MalleableSpec(job_id, 1, 4)
    never.start(
        resize_action("malleable", job, 2, 4, "grow"),
        job,
        spec,
        at=sim.at(sim.now),
        slurm_version=sim.version(),
        to_gpus=4,
    )
    sim.run_until(sim.now + spec.checkpoint_grace.total_seconds() + 1)
    never.advance(_listing(sim), sim.at(sim.now))
    assert [r.state for r in store.in_states([KIND], [ABORTED])] == [ABORTED]
    assert sim.job(job_id).allocated_gpus == 2 and sim.job(job_id).restarts == 0


def test_memory_transactions_keep_one_open_row_per_job_and_compare_and_set() -> None:
    store = MemoryTransactions()
    first = store.create(7, KIND, "planned", at=T, deadline=None, payload={}, open_states=OPEN)
    assert first is not None
    again = store.create(7, KIND, "planned", at=T, deadline=None, payload={}, open_states=OPEN)
    assert again is None  # one open transaction per job
    moved = store.advance(first, "signaled", at=T, payload={"a": 1})
    assert moved is not None and moved.payload == {"a": 1} and moved.attempts == 1
    assert store.advance(first, "signaled", at=T) is None  # a stale row moves nothing
    assert [r.id for r in store.in_states([KIND], ["signaled"])] == [first.id]


def test_sim_acks_count_each_new_checkpoint_once() -> None:
    sim, job_id = _typed_sim()
    acks = SimAcks(sim)
    assert acks("", job_id) is None
    for n in (1, 2, 3):
        sim.signal(job_id, "USR2")
        sim.run_until(sim.now + sim.runtime.checkpoint_s + 1)
        ack = acks("", job_id)
        assert ack is not None and ack.acks == n
        assert acks("", job_id) == ack  # read again: the same acknowledgement
