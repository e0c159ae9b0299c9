"""A policy cycle (idle GPU, rightsize) on a real SQLite store with the in-memory Slurm
fake, and the running jobs it watches."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from slurmgpu.actuate.actuator import Actuator
from slurmgpu.daemon.policy_cycle import PolicyCycle
from slurmgpu.model import ClusterSnapshot, GpuRequest, Job, JobState, NodeGpuAllocation
from slurmgpu.policy.base import Mode
from slurmgpu.policy.engine import PolicyEngine
from slurmgpu.policy.idle import IdleGpuPolicy
from slurmgpu.policy.rightsize import RightsizePolicy
from slurmgpu.policy.settings import EngineSettings, IdleGpuSettings, RightsizeSettings
from slurmgpu.store import JobStore, open_store
from slurmgpu.store.audit import AuditStore
from slurmgpu.store.usage import UsageStore
from slurmgpu.wire import GpuSampleIn, SampleBatch
from tests.fakes import FakeSlurm

T0 = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=6)


def running_job(job_id: int, *, requeue: bool = True) -> Job:
    return Job(
        job_id=job_id,
        name="train",
        user="alice",
        state=JobState.RUNNING,
        requeue=requeue,
        submit_time=T0 - timedelta(hours=3),
        start_time=T0 - timedelta(hours=3),
        time_limit=timedelta(hours=12),
        cpus=4,
        node_count=1,
        nodes=("gpu1",),
        gpus=GpuRequest(gpus=1, per_node=1, sources=("tres_per_node",)),
        gpu_allocations=(NodeGpuAllocation("gpu1", (job_id % 4,)),),
    )


class World:
    def __init__(self, tmp: Path, mode: Mode) -> None:
        self.store: JobStore = open_store(f"sqlite:///{tmp / 's.db'}")
        self.usage = UsageStore(self.store.engine)
        self.audit = AuditStore(self.store.engine)
        self.slurm = FakeSlurm()
        idle = IdleGpuSettings(mode=mode)
        rightsize = RightsizeSettings(mode=mode)
        engine = PolicyEngine(
            [(IdleGpuPolicy(idle), mode), (RightsizePolicy(rightsize), mode)], EngineSettings()
        )
        self.cycle = PolicyCycle(engine, self.usage, self.audit, Actuator(self.slurm, self.audit))
        self.seq = 0

    def samples(self, job: Job, start: datetime, end: datetime, util: float) -> None:
        gpu = []
        t = start
        while t <= end:
            self.seq += 1
            gpu.append(
                GpuSampleIn(
                    sample_uid=f"s{self.seq}",
                    at=t.timestamp(),
                    gpu_index=job.gpu_allocations[0].gpu_indices[0],
                    job_id=job.job_id,
                    util_pct=util,
                    memory_used_mib=100.0,
                    processes=1,
                    source="device",
                )
            )
            t += timedelta(minutes=1)
        self.usage.ingest(SampleBatch(node="gpu1", gpu=gpu))

    def run(self, jobs: list[Job], at: datetime) -> None:
        self.slurm.set_jobs(jobs)
        snap = ClusterSnapshot(taken_at=at, jobs=tuple(jobs), nodes=())
        self.cycle.run(snap, at)

    def alerts(self, job_id: int) -> list[tuple[str, str]]:
        return [(r.kind, r.outcome) for r in reversed(self.audit.list(job_id=job_id))]
