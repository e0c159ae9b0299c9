"""Finished jobs, their GPU and host usage, and note look-ups for the efficiency tests."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from slurmgpu.jobdiff import diff_jobs
from slurmgpu.model import GpuRequest, Job, JobState, NodeGpuAllocation
from slurmgpu.report.eff_advice import Note
from slurmgpu.store import JobStore, open_store
from slurmgpu.store.usage_query import GpuUsage, HostUsage

T0 = datetime(2025, 3, 1, 8, 0, tzinfo=UTC)
GIB = 1024
H100_MIB = 81559.0


def make_job(
    *,
    job_id: int = 100,
    state: JobState = JobState.COMPLETED,
    elapsed: timedelta = timedelta(hours=2),
    time_limit: timedelta | None = timedelta(hours=3),
    cpus: int = 4,
    memory_mib: int | None = None,
    gpus: dict[str, tuple[int, ...]] | None = None,
    shards: int = 0,
    tasks: int = 1,
    **extra: Any,
) -> Job:
    gpus = {"gpu1": (0,)} if gpus is None else gpus
    allocations = tuple(NodeGpuAllocation(node, indices) for node, indices in gpus.items())
    total = sum(len(i) for i in gpus.values())
    return Job(
        job_id=job_id,
        name="train",
        user="alice",
        account="ml",
        partition="gpu",
        state=state,
        start_time=T0,
        end_time=T0 + elapsed if state.is_terminal else None,
        time_limit=time_limit,
        cpus=cpus,
        memory_mib=memory_mib,
        node_count=len(gpus) or 1,
        tasks=tasks,
        gpus=GpuRequest(gpus=total, shards=shards),
        nodes=tuple(gpus) or ("gpu1",),
        gpu_allocations=allocations,
        **extra,
    )


def gpu(
    index: int,
    mean: float,
    *,
    node: str = "gpu1",
    peak: float | None = None,
    memory_mib: float = 20_000.0,
    total_mib: float | None = H100_MIB,
    idle: timedelta = timedelta(0),
    never_busy: bool | None = None,
    processes: int | None = 1,
    samples: int = 240,
    errors: int = 0,
    span: timedelta = timedelta(hours=2),
) -> GpuUsage:
    never = mean == 0 and (peak or 0) == 0 if never_busy is None else never_busy
    return GpuUsage(
        node=node,
        gpu_index=index,
        samples=samples,
        mean_util_pct=mean,
        max_util_pct=peak if peak is not None else min(100.0, mean * 1.2),
        max_memory_mib=memory_mib,
        memory_total_mib=total_mib,
        first_at=T0,
        last_at=T0 + span,
        trailing_idle=span if never else idle,
        never_busy=never,
        shared=False,
        error_samples=errors,
        max_processes=processes,
    )


def host(node: str, cpu_pct: float, cpus: int, memory_mib: float = 4 * GIB) -> HostUsage:
    return HostUsage(
        node=node,
        samples=240,
        mean_cpu_pct=cpu_pct,
        max_cpu_pct=cpu_pct,
        cpus_allocated=cpus,
        max_memory_mib=memory_mib,
    )


def ended(job: Job) -> datetime:
    return (job.end_time or T0) + timedelta(minutes=5)


def kinds(found: list[Note]) -> list[str]:
    return [n.kind for n in found]


def one(found: list[Note], kind: str) -> Note:
    (note,) = [n for n in found if n.kind == kind]
    return note


def store_job(url: str, job: Job) -> JobStore:
    store = open_store(url)
    store.apply_cycle(diff_jobs({}, [job]), {}, [], T0)
    return store
