"""SimSlurm's node listing and the runner's usage stay right as jobs take and leave GPUs.

Both are kept between cycles (sim.slurm ``nodes()``, sim.usage ``UsageModel``) and
rebuilt only for what changed; these follow one job through start, an in-place shrink
and its end and check each listing against what the cluster holds at that moment.
"""

from __future__ import annotations

from slurmgpu.intent import SetNodes
from slurmgpu.sim.slurm import SimSlurm
from slurmgpu.sim.usage import UsageModel
from slurmgpu.sim.workload import RigidJob, TraceJob


def _used(sim: SimSlurm) -> list[tuple[str, str, int]]:
    return [(n.name, n.state, n.gpus_used) for n in sim.nodes()]


def test_node_listing_follows_a_job_through_start_shrink_and_end() -> None:
    sim = SimSlurm(2, 4)
    idle = _used(sim)
    assert [s for _, s, _ in idle] == ["idle", "idle"]
    job_id = sim.submit_job(
        TraceJob(submit_s=0.0, name="A", user="u", model=RigidJob(1000, 8), gpus=8)
    )
    sim.run_until(1)
    assert [(s, u) for _, s, u in _used(sim)] == [("allocated", 4), ("allocated", 4)]
    sim.update_job(job_id, (SetNodes(1),))
    kept = {sim.job_record(sim.job(job_id)).nodes[0]}
    assert {(name, s, u) for name, s, u in _used(sim)} == {
        (name, "allocated" if name in kept else "idle", 4 if name in kept else 0)
        for name, _, _ in idle
    }
    sim.run_until(100_000)
    assert _used(sim) == idle


def test_usage_counts_samples_and_follows_a_shrink() -> None:
    sim = SimSlurm(2, 4)
    job_id = sim.submit_job(
        TraceJob(submit_s=0.0, name="A", user="u", model=RigidJob(10_000, 8), gpus=8)
    )
    model = UsageModel(sim, 30.0)
    sim.run_until(1)
    first = model.usage()[job_id]
    assert len(first.gpus) == 8 and {g.samples for g in first.gpus} == {1}
    sim.run_until(301)
    later = model.usage()
    assert list(later) == [job_id] and {g.samples for g in later[job_id].gpus} == {10}
    sim.update_job(job_id, (SetNodes(1),))
    (node,) = sim.job_record(sim.job(job_id)).nodes
    shrunk = model.usage()[job_id]
    assert sorted((g.node, g.gpu_index) for g in shrunk.gpus) == [(node, i) for i in range(4)]
    sim.run_until(100_000)
    assert dict(model.usage()) == {}
