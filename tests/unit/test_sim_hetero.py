"""A heterogeneous simulated cluster: typed nodes, placement by type, per-type speed and use."""

from __future__ import annotations

import math

import pytest

from slurmgpu.intent import SetGpus
from slurmgpu.model import JobState
from slurmgpu.sim.gputypes import speed_factor
from slurmgpu.sim.metrics import summarise, type_use
from slurmgpu.sim.run import ClusterShape, simulate
from slurmgpu.sim.slurm import SimJob, SimSlurm
from slurmgpu.sim.workload import RigidJob, TraceJob
from slurmgpu.slurm.client import SlurmCommandError
from slurmgpu.telemetry.gpupower import GPU_POWER


def job(name: str, gpus: int, run_s: float, gpu_type: str | None = None) -> TraceJob:
    return TraceJob(
        submit_s=0.0,
        name=name,
        user="alice",
        model=RigidJob(run_s, gpus),
        gpus=gpus,
        time_limit_s=None,
        gpu_type=gpu_type,
    )


def test_cluster_text_names_groups_of_typed_nodes_and_plain_shapes_still_parse() -> None:
    shape = ClusterShape.parse("8xa100:4,8xv100:4")
    assert (shape.nodes, shape.gpus_per_node, shape.types) == (16, 4, ((8, "a100"), (8, "v100")))
    assert shape.gpus_by_type() == {"a100": 32, "v100": 32}
    assert ClusterShape.parse("16x4") == ClusterShape(16, 4, 4)
    assert ClusterShape.parse("16x4").node_types() is None


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("8xh100:4,8xv100:4", "no measured speed for GPU type 'h100'"),
        ("8xv100:4,8x4", "a GPU type .8xa100:4. or none"),
        ("8xv100,8xt4:4", "a GPU type .8xa100:4. or none"),
        ("8x:4", "must look like 8xv100:4"),
        ("0xv100:4", "has no GPU"),
    ],
)
def test_bad_cluster_text_is_one_clear_error(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        ClusterShape.parse(text)


def test_typed_job_lands_on_its_type_and_untyped_goes_anywhere() -> None:
    sim = SimSlurm(2, 4, node_types=["v100", "p100"])
    a = sim.submit_job(job("A", 2, 100, "p100"))
    b = sim.submit_job(job("B", 4, 100))  # untyped: best fit, the whole free v100 node
    c = sim.submit_job(job("C", 4, 100, "p100"))  # p100 has only 2 free: waits
    sim.run_until(1)
    nodes = {n.name: n for n in sim.nodes()}
    rec = {j: sim.job_record(sim.job(j)) for j in (a, b, c)}
    assert [nodes[n].gpu_type for n in rec[a].nodes] == ["p100"]
    assert rec[a].gpus.gpu_type == "p100"
    assert [nodes[n].gpu_type for n in rec[b].nodes] == ["v100"]
    assert rec[c].state is JobState.PENDING
    sim.run_until(10_000)
    assert sim.job(c).first_start_s == pytest.approx(100.0)
    assert [nodes[n].gpu_type for n in sim.job_record(sim.job(c)).nodes] == ["p100"]


def test_a_type_the_cluster_lacks_is_refused_as_by_slurm() -> None:
    sim = SimSlurm(2, 4, node_types=["v100", "p100"])
    with pytest.raises(SlurmCommandError, match="gres"):
        sim.submit_job(job("A", 1, 100, "k80"))
    with pytest.raises(SlurmCommandError, match="4 such GPUs"):
        sim.submit_job(job("B", 6, 100, "v100"))


def test_speed_per_type_and_a_job_over_two_types_runs_at_the_slower() -> None:
    speeds = {"v100": 1.0, "p100": 0.5}

    def speed(j: SimJob, t: str) -> float:
        return speeds[t]

    sim = SimSlurm(2, 4, node_types=["v100", "p100"], type_speed=speed)
    a = sim.submit_job(job("A", 4, 100, "p100"))
    sim.run_until(10_000)
    assert sim.job(a).end_s == pytest.approx(200.0)  # half speed on p100
    sim2 = SimSlurm(2, 4, node_types=["v100", "p100"], type_speed=speed)
    b = sim2.submit_job(job("B", 8, 100))  # spans both nodes
    sim2.run_until(10_000)
    assert sim2.job(b).end_s == pytest.approx(200.0)


def test_resize_update_keeps_or_changes_the_type_through_tres() -> None:
    sim = SimSlurm(2, 4, node_types=["v100", "p100"])
    a = sim.submit_job(job("A", 1, 100, "v100"))
    sim.hold(str(a))
    sim.update_job(a, (SetGpus(2, "p100", per_node=False),))
    assert sim.job_record(sim.job(a)).gpus.gpu_type == "p100"
    sim.update_job(a, (SetGpus(3, per_node=False),))
    assert sim.job_record(sim.job(a)).gpus.gpu_type is None
    with pytest.raises(SlurmCommandError, match="no gpu:k80"):
        sim.update_job(a, (SetGpus(1, "k80", per_node=False),))


def test_measured_factors_for_pollux_applications() -> None:
    # Sia's profiles: T4 is the Pollux profiles' own GPU; the best type differs by app
    assert speed_factor("cifar10", "t4") == 1.0
    assert speed_factor("bert", "a100") > speed_factor("bert", "v100") > 1.0
    assert speed_factor("deepspeech2", "v100") > speed_factor("deepspeech2", "a100")
    assert speed_factor("ncf", "v100") < speed_factor("ncf", "a100") < 1.0
    assert 0.0 < speed_factor(None, "v100") < speed_factor(None, "a100")


def test_per_type_use_and_energy_add_up() -> None:
    shape = ClusterShape.parse("1xv100:4,1xt4:4")
    trace = [job("A", 4, 3600, "v100"), job("B", 4, 1800, "t4")]
    run = simulate(trace, shape, "slurm")
    use = type_use(run)
    # RigidJob (no application): the mean of the measured factors on V100; T4 is 1
    v100_s = 3600 / speed_factor(None, "v100")
    makespan = max(v100_s, 1800.0)
    assert use["v100"].gpu_hours == pytest.approx(4 * v100_s / 3600)
    assert use["t4"].gpu_hours == pytest.approx(2.0)
    v, p = GPU_POWER["v100"], GPU_POWER["t4"]
    want_v = (v.idle_w * 4 * makespan + (v.busy_w - v.idle_w) * 4 * v100_s) / 3.6e6
    want_p = (p.idle_w * 4 * makespan + (p.busy_w - p.idle_w) * 4 * 1800) / 3.6e6
    assert use["v100"].energy_kwh == pytest.approx(want_v)
    assert use["t4"].energy_kwh == pytest.approx(want_p)
    total = summarise(run).energy_kwh
    assert total == pytest.approx(want_v + want_p)
    assert math.isfinite(total)
    assert type_use(simulate([job("C", 4, 60)], ClusterShape(1, 4), "slurm")) == {}


def test_a_resize_keeps_the_job_s_type_or_moves_it_to_the_one_the_policy_named() -> None:
    # The daemon's executor (cycle.resize.resize_intent) spells the held job's update.
    from slurmgpu.cycle.resize import ResizeExecutor
    from slurmgpu.cycle.transactions import MemoryTransactions
    from slurmgpu.intent import Resize
    from slurmgpu.model import MalleableSpec
    from slurmgpu.policy.base import Action
    from slurmgpu.sim.slurm import SimSlurm
    from slurmgpu.sim.workload import MalleableRange, TraceJob

    def fields(gpu_type: str | None, moved: str | None) -> dict[str, str]:
        sim = SimSlurm(2, 4, node_types=None if gpu_type is None else ["v100", "a100"])
        spec = TraceJob(
            0, "A", "alice", RigidJob(3600, 2), gpus=2, gpu_type=gpu_type,
            malleable=MalleableRange(1, 4),
        )  # fmt: skip
        jid = sim.submit_job(spec)
        sim.run_until(1)
        listed = next(j for j in sim.jobs() if j.job_id == jid)
        grow = Action("malleable", "resize", jid, "alice", "", intents=(Resize(2, 4, moved),))
        executor = ResizeExecutor(sim, MemoryTransactions(), acks=lambda d, j: None)
        row = executor.start(
            grow, listed, MalleableSpec(jid, 1, 4), at=sim.at(1), to_gpus=4,
            slurm_version=sim.version(),
        )  # fmt: skip
        return dict(row.payload["fields"])

    assert fields("v100", None) == {"TresPerJob": "gres:gpu:v100:4"}
    assert fields(None, None) == {"TresPerJob": "gres:gpu:4"}
    assert fields("v100", "a100") == {"TresPerJob": "gres:gpu:a100:4"}


def test_the_type_aware_set_is_the_malleable_policy_with_the_measured_speeds() -> None:
    from slurmgpu.policy.malleable import MalleablePolicy
    from slurmgpu.sim.policysets import build_engine, known_sets, measured_speed_table

    assert "malleable-types" in known_sets()
    ((policy, _),) = build_engine("malleable-types").policies
    assert isinstance(policy, MalleablePolicy)
    assert policy.settings.type_aware
    table = dict(measured_speed_table())
    assert dict(table["ncf"])["a100"] == speed_factor("ncf", "a100")
    assert "*" in table
    ((blind, _),) = build_engine("malleable").policies
    assert isinstance(blind, MalleablePolicy) and not blind.settings.type_aware
