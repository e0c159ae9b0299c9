"""A simulated cluster of nodes of different sizes (issue 38: whatif on a mixed site).

``ClusterShape.node_gpus`` / ``SimSlurm(node_gpus=...)``: each node has its own GPU count.
A uniform cluster spelled that way simulates exactly as before.
"""

from __future__ import annotations

import random
from dataclasses import asdict

import pytest

from slurmgpu.model import JobState
from slurmgpu.sim.metrics import summarise
from slurmgpu.sim.run import ClusterShape, simulate
from slurmgpu.sim.slurm import SimSlurm
from slurmgpu.sim.workload import RigidJob, TraceJob
from slurmgpu.slurm.client import SlurmCommandError


def job(name: str, gpus: int, run_s: float, *, per_node: int | None = None) -> TraceJob:
    return TraceJob(
        submit_s=0.0,
        name=name,
        user="alice",
        model=RigidJob(run_s, gpus),
        gpus=gpus,
        time_limit_s=2 * run_s,
        gpus_per_node=per_node,
    )


def test_the_shape_of_stored_nodes_keeps_each_node_s_size() -> None:
    mixed = ClusterShape.of_nodes([4, 0, 8, 4, 4])  # a node without GPUs is left out
    assert (mixed.nodes, mixed.gpus_per_node, mixed.node_gpus) == (4, 8, (8, 4, 4, 4))
    assert mixed.gpus == 20 and mixed.text() == "1x8,3x4"
    assert ClusterShape.parse("1x8,3x4") == mixed
    uniform = ClusterShape.of_nodes([4, 4, 4], shards_per_gpu=16)
    assert uniform == ClusterShape(3, 4, 16) and uniform.text() == "3x4"
    with pytest.raises(ValueError, match="no node with a GPU"):
        ClusterShape.of_nodes([0])
    typed = ClusterShape.parse("1xv100:8,2xt4:4")
    assert typed.node_gpus == (8, 4, 4) and typed.gpus_by_type() == {"v100": 8, "t4": 8}
    assert typed.text() == "1xv100:8,2xt4:4"


def test_an_8_gpu_job_runs_on_the_8_gpu_node_not_spread_over_small_ones() -> None:
    sim = SimSlurm(3, 8, node_gpus=[4, 8, 4])
    assert sim.total_gpus == 16 and [len(n.gpu_owner) for n in sim._nodes] == [4, 8, 4]
    big = sim.submit_job(job("big", 8, 100, per_node=8))
    small = sim.submit_job(job("small", 4, 100))
    sim.run_until(1)
    assert sim.job(big).alloc == [(1, tuple(range(8)))]
    assert sim.job(small).state is JobState.RUNNING and sim.job(small).alloc[0][0] in (0, 2)
    # a second 8-per-node job waits for the one node that has 8, though 4 GPUs are free
    again = sim.submit_job(job("again", 8, 100, per_node=8))
    sim.run_until(2)
    assert sim.job(again).state is JobState.PENDING
    sim.run_until(10_000)
    assert sim.job(again).first_start_s == pytest.approx(100.0)
    with pytest.raises(SlurmCommandError, match="do not fit nodes of 8"):
        sim.submit_job(job("huge", 16, 100, per_node=16))
    with pytest.raises(ValueError, match="node_gpus"):
        SimSlurm(2, 4, node_gpus=[4])


def _mixed_trace(n: int, seed: int) -> list[TraceJob]:
    """Seeded jobs of 1-8 GPUs and shard jobs, some over-asking, arriving over hours."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        gpus = rng.choice((0, 1, 2, 4, 8))
        model = RigidJob(rng.uniform(600, 6 * 3600), max(1, gpus))
        model.util_pct = rng.choice((5.0, 40.0, 95.0))
        out.append(
            TraceJob(
                submit_s=rng.uniform(0, 4 * 3600),
                name=f"j{i % 7}",
                user=f"u{i % 3}",
                model=model,
                gpus=gpus,
                shards=0 if gpus else rng.choice((1, 2)),
                time_limit_s=8 * 3600,
            )
        )
    return sorted(out, key=lambda t: t.submit_s)


def test_a_uniform_cluster_given_node_by_node_simulates_exactly_as_before() -> None:
    plain = ClusterShape(4, 4)
    listed = ClusterShape(4, 4, node_gpus=(4, 4, 4, 4))
    for policy_set in ("slurm", "all"):
        a = summarise(simulate(_mixed_trace(40, 3), plain, policy_set), 0.0)
        b = summarise(simulate(_mixed_trace(40, 3), listed, policy_set), 0.0)
        assert a.completed > 0 and asdict(a) == asdict(b), policy_set


def test_a_mixed_site_is_simulated_as_it_is_not_flattened() -> None:
    """One 8-GPU node and two 4-GPU nodes: 8-GPU jobs of 8 per node run one at a time on
    the big node; flattened to 4x4 (the old inference) they could not run at all."""
    trace = [job(f"j{i}", 8, 3600, per_node=8) for i in range(3)]
    run = simulate(trace, ClusterShape.of_nodes([8, 4, 4]), "slurm")
    starts = sorted(j.first_start_s for j in run.jobs)
    assert starts == pytest.approx([0.0, 3600.0, 7200.0])
    assert all(j.state is JobState.COMPLETED for j in run.jobs)
