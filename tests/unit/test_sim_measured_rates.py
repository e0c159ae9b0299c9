"""What the simulator reports to the malleable policy as a job's measured speed: per GPU
count, the speed of its latest run at that count on the layout that run had, as the
job's runtime reports it to the daemon (elastic/runtime.py: progress.json), not the
speed of the compact layout of that count."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from slurmgpu.model import ClusterSnapshot
from slurmgpu.sim.run import ClusterShape, SimOptions, _Runner
from slurmgpu.sim.workload import JobModel, MalleableRange, RigidJob, TraceJob, packed

T = datetime(2024, 1, 1)


@dataclass
class SpreadSlow:
    """A job that runs at half speed when its GPUs are on more than one node."""

    work: float = 10_000.0
    util_pct: float = 100.0
    memory_mib: float = 1024.0

    def rate(self, placement: Sequence[int]) -> float:
        return float(sum(placement)) * (0.5 if len(placement) > 1 else 1.0)

    def run_time(self, gpus: int, gpus_per_node: int) -> float:
        return self.work / self.rate(packed(gpus, gpus_per_node))


def _job(
    name: str, gpus: int, model: JobModel, malleable: MalleableRange | None = None
) -> TraceJob:
    return TraceJob(
        submit_s=0, name=name, user="alice", model=model, gpus=gpus, malleable=malleable
    )


def test_a_spread_run_reports_the_speed_of_its_own_layout() -> None:
    runner = _Runner([], ClusterShape(2, 4), "malleable", SimOptions(), None)
    sim = runner.sim
    # 3 GPUs taken on each node: the malleable job's 2 GPUs land on both nodes
    sim.submit_job(_job("a", 3, RigidJob(36_000, 3)))
    sim.submit_job(_job("b", 3, RigidJob(36_000, 3)))
    sim.run_until(5)
    job_id = sim.submit_job(_job("m", 2, SpreadSlow(), MalleableRange(1, 2)))
    sim.run_until(10)
    assert sim.job(job_id).placement == (1, 1)
    listing = ClusterSnapshot(sim.at(sim.now), tuple(sim.jobs()), tuple(sim.nodes()), "24.11")
    view = runner.malleable_view(listing, sim.at(sim.now))
    assert view.throughput[job_id] == {2: 1.0}  # 2 GPUs at half speed; compact: 2.0
