"""Array pools in the simulator: the daemon's dispatcher sends a pool's resize to
``cycle.pool.PoolExecutor`` on SimSlurm, and the runner lists a ``sgpu:pool=`` array
as the daemon's directory does (one spec, by array id)."""

from __future__ import annotations

from slurmgpu.intent import Resize
from slurmgpu.model import ClusterSnapshot, JobState, MalleableSpec
from slurmgpu.policy.base import Action, Decision, Mode
from slurmgpu.sim.resizes import SimResizes
from slurmgpu.sim.run import ClusterShape, SimOptions, _Runner
from slurmgpu.sim.slurm import SimSlurm
from slurmgpu.sim.workload import RigidJob, TraceJob

POOL = TraceJob(
    0,
    "sweep",
    "alice",
    RigidJob(3600, 1),
    gpus=1,
    gpus_per_node=1,
    comment="sgpu:pool=1:4",
    array_tasks=6,
    array_throttle=4,
)


def test_a_pool_shrink_lowers_the_throttle_and_requeues_the_newest_tasks() -> None:
    sim = SimSlurm(1, 4)
    sim.submit_job(POOL)
    sim.run_until(10)
    tasks = [j for j in sim.all_jobs.values() if j.array_job_id is not None]
    array_id = tasks[0].array_job_id
    assert array_id is not None
    assert sum(t.state is JobState.RUNNING for t in tasks) == 4
    resizes = SimResizes(sim)
    listing = ClusterSnapshot(sim.at(sim.now), tuple(sim.jobs()), tuple(sim.nodes()), sim.version())
    action = Action("test", "resize", array_id, "alice", "t", intents=(Resize(4, 2),))
    spec = {array_id: MalleableSpec(array_id, 1, 4, pool=True)}
    done = resizes.carry_out(Decision(action, Mode.ENFORCE, True, True), listing, spec)
    assert done.outcome == "done" and done.row is not None and done.row.kind == "pool"
    # pending tasks left: the chosen tasks are requeued at once (SIGTERM is the request)
    assert done.row.payload["by_sigterm"] is True
    sim.run_until(sim.now + 5)
    running = [t for t in tasks if t.state is JobState.RUNNING]
    assert len(running) == 2 and sum(t.restarts for t in tasks) == 2
    (meta,) = [j for j in sim.jobs() if j.array_job_id == array_id and j.array_task_spec]
    assert meta.array_max_tasks == 2  # the throttle was lowered first
    (row,) = resizes.transactions.recent(["pool"])
    assert row.state == "running" and not resizes.in_flight
    assert sorted(t["state"] for t in row.payload["tasks"].values()) == ["requeued"] * 2


def test_the_runner_lists_a_pool_by_its_array_id() -> None:
    runner = _Runner([POOL], ClusterShape(1, 4), "malleable", SimOptions(), None)
    runner.sim.submit_job(POOL)
    runner.sim.run_until(10)
    specs, rates = runner._malleable_view()
    (array_id,) = {j.array_job_id for j in runner.sim.all_jobs.values()}
    assert array_id is not None
    assert specs == {array_id: MalleableSpec(array_id, 1, 4, pool=True)} and rates == {}
