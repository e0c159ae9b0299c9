"""Hand-built jobs, usage, history and snapshots for the policy tests."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from slurmgpu.model import ClusterSnapshot, GpuRequest, Job, JobState, NodeGpuAllocation
from slurmgpu.policy.base import GpuStat, HistoryRecord, JobUsage, PolicySnapshot, PriorAlert

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
MIN = timedelta(minutes=1)
HOUR = timedelta(hours=1)


def pending_job(
    job_id: int = 100,
    *,
    user: str = "alice",
    name: str = "train",
    partition: str = "gpu",
    time_limit: timedelta | None = timedelta(hours=8),
    cpus: int = 48,
    memory_mib: int | None = 64 * 1024,
    gpus_per_node: int | None = 4,
    gpus_per_job: int | None = None,
    node_count: int = 1,
    **extra: Any,
) -> Job:
    per_node_total = (gpus_per_node or 0) * node_count
    request = GpuRequest(
        gpus=gpus_per_job if gpus_per_job is not None else per_node_total,
        per_node=gpus_per_node,
        per_job=gpus_per_job,
        sources=("tres_per_job",) if gpus_per_job is not None else ("tres_per_node",),
    )
    fields: dict[str, Any] = {
        "job_id": job_id,
        "name": name,
        "user": user,
        "state": JobState.PENDING,
        "partition": partition,
        "submit_time": T0 - HOUR,
        "time_limit": time_limit,
        "cpus": cpus,
        "memory_mib": memory_mib,
        "node_count": node_count,
        "tasks": 1,
        "gpus": request,
        "requeue": True,
    }
    fields.update(extra)
    return Job(**fields)


def running_job(
    job_id: int = 200,
    *,
    user: str = "alice",
    name: str = "train",
    partition: str = "gpu",
    started: timedelta = 2 * HOUR,
    gpus: Mapping[str, tuple[int, ...]] | None = None,
    at: datetime = T0,
    **extra: Any,
) -> Job:
    layout = {"gpu1": (0,)} if gpus is None else gpus
    allocations = tuple(NodeGpuAllocation(node, idx) for node, idx in layout.items())
    total = sum(len(i) for i in layout.values())
    per_node = max((len(i) for i in layout.values()), default=0)
    fields: dict[str, Any] = {
        "job_id": job_id,
        "name": name,
        "user": user,
        "state": JobState.RUNNING,
        "partition": partition,
        "submit_time": at - started - HOUR,
        "start_time": at - started,
        "time_limit": timedelta(hours=24),
        "cpus": 8,
        "memory_mib": 32 * 1024,
        "node_count": len(layout),
        "tasks": 1,
        "gpus": GpuRequest(gpus=total, per_node=per_node, sources=("tres_per_node",)),
        "nodes": tuple(layout),
        "gpu_allocations": allocations,
        "requeue": True,
    }
    fields.update(extra)
    return Job(**fields)


def gpu(
    node: str = "gpu1",
    index: int = 0,
    *,
    idle: timedelta = timedelta(0),
    never_busy: bool = False,
    samples: int = 100,
    util: float | None = 0.0,
    last_sample_at: datetime | None = T0,
) -> GpuStat:
    return GpuStat(
        node=node,
        gpu_index=index,
        samples=samples,
        mean_util_pct=util,
        max_util_pct=util,
        max_memory_mib=0.0,
        memory_total_mib=81559.0,
        trailing_idle=idle,
        never_busy=never_busy,
        last_sample_at=last_sample_at,
    )


def usage(job_id: int, *gpus: GpuStat) -> JobUsage:
    return JobUsage(job_id=job_id, gpus=tuple(gpus), mean_cpu_pct=100.0, max_memory_mib=1000.0)


def record(
    *,
    user: str = "alice",
    name: str = "train",
    partition: str = "gpu",
    run_time: timedelta = HOUR,
    state: str = "COMPLETED",
    gpus_requested: int = 4,
    gpus_used: int | None = 4,
    cpus: int = 48,
    peak_memory_mib: float | None = 10_000.0,
    peak_node_memory_mib: float | None = None,
    mean_cpu_pct: float | None = 800.0,
    script_hash: str | None = None,
    restarts: int = 0,
) -> HistoryRecord:
    return HistoryRecord(
        user=user,
        name=name,
        partition=partition,
        script_hash=script_hash,
        state=state,
        run_time=run_time,
        time_limit=timedelta(hours=8),
        gpus_requested=gpus_requested,
        gpus_used=gpus_used,
        cpus=cpus,
        memory_requested_mib=64 * 1024,
        peak_memory_mib=peak_memory_mib,
        mean_cpu_pct=mean_cpu_pct,
        mean_gpu_util_pct=60.0,
        peak_gpu_memory_mib=20_000.0,
        ended_at=T0 - timedelta(days=1),
        peak_node_memory_mib=peak_node_memory_mib,
        restarts=restarts,
    )


def alert(job_id: int, kind: str, at: datetime, policy: str = "idle_gpu") -> PriorAlert:
    return PriorAlert(job_id=job_id, policy=policy, kind=kind, at=at)


def snapshot(
    jobs: Iterable[Job] = (),
    *,
    at: datetime = T0,
    usage_by_job: Iterable[JobUsage] = (),
    history: Iterable[HistoryRecord] = (),
    alerts: Iterable[PriorAlert] = (),
    last_action_at: Mapping[int, datetime] | None = None,
    user_actions_last_hour: Mapping[str, int] | None = None,
    opted_in: Iterable[int] = (),
    slurm_version: str = "24.05.4",
) -> PolicySnapshot:
    return PolicySnapshot(
        at=at,
        cluster=ClusterSnapshot(
            taken_at=at, jobs=tuple(jobs), nodes=(), slurm_version=slurm_version
        ),
        usage={u.job_id: u for u in usage_by_job},
        history=tuple(history),
        alerts=tuple(alerts),
        last_action_at=dict(last_action_at or {}),
        user_actions_last_hour=dict(user_actions_last_hour or {}),
        opted_in=frozenset(opted_in),
    )
