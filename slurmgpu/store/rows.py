"""Conversion between model objects and table rows (exact round trip for jobs)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from slurmgpu.model import GpuRequest, Job, JobState, Node, NodeGpuAllocation


def _flags(flags: frozenset[str]) -> str:
    return ",".join(sorted(flags))


def _unflags(text: str) -> frozenset[str]:
    return frozenset(f for f in text.split(",") if f)


def job_to_row(job: Job) -> dict[str, Any]:
    """Return the ``jobs`` columns describing ``job`` (bookkeeping columns excluded)."""
    g = job.gpus
    return {
        "job_id": job.job_id,
        "name": job.name,
        "user": job.user,
        "uid": job.uid,
        "account": job.account,
        "partition": job.partition,
        "qos": job.qos,
        "state": job.state.value,
        "state_flags": _flags(job.state_flags),
        "reason": job.reason,
        "array_job_id": job.array_job_id,
        "array_task_id": job.array_task_id,
        "array_task_spec": job.array_task_spec,
        "array_max_tasks": job.array_max_tasks,
        "submit_time": job.submit_time,
        "eligible_time": job.eligible_time,
        "start_time": job.start_time,
        "end_time": job.end_time,
        "time_limit_s": None if job.time_limit is None else int(job.time_limit.total_seconds()),
        "cpus": job.cpus,
        "memory_mib": job.memory_mib,
        "node_count": job.node_count,
        "tasks": job.tasks,
        "gpus": g.gpus,
        "gpus_per_node": g.per_node,
        "gpus_per_job": g.per_job,
        "gpus_per_task": g.per_task,
        "gpu_type": g.gpu_type,
        "shards": g.shards,
        "shards_per_node": g.shards_per_node,
        "mps": g.mps,
        "mps_per_node": g.mps_per_node,
        "gpu_sources": ",".join(g.sources),
        "nodes": ",".join(job.nodes),
        "gpu_alloc": [
            {
                "node": a.node,
                "gpus": list(a.gpu_indices),
                "shard_gpus": list(a.shard_indices),
                "shards": a.shards,
                # MPS shares only where the job has one (rows written before have none)
                **(
                    {"mps_gpus": list(a.mps_indices), "mps": a.mps}
                    if a.mps or a.mps_indices
                    else {}
                ),
            }
            for a in job.gpu_allocations
        ],
        "restart_count": job.restart_count,
        "requeue": job.requeue,
        "comment": job.comment,
        "admin_comment": job.admin_comment,
        "work_dir": job.work_dir,
        "command": job.command,
        "exit_code": job.exit_code,
        "batch": job.batch,
    }


def _seconds(value: int | None) -> timedelta | None:
    return None if value is None else timedelta(seconds=value)


def row_to_job(row: Mapping[Any, Any]) -> Job:
    """Return the Job a ``jobs`` row describes (inverse of :func:`job_to_row`)."""
    alloc = tuple(
        NodeGpuAllocation(
            node=str(a["node"]),
            gpu_indices=tuple(int(i) for i in a.get("gpus", ())),
            shard_indices=tuple(int(i) for i in a.get("shard_gpus", ())),
            shards=int(a.get("shards", 0)),
            mps_indices=tuple(int(i) for i in a.get("mps_gpus", ())),
            mps=int(a.get("mps", 0)),
        )
        for a in (row["gpu_alloc"] or ())
    )
    return Job(
        job_id=int(row["job_id"]),
        name=row["name"],
        user=row["user"],
        uid=row["uid"],
        account=row["account"],
        partition=row["partition"],
        qos=row["qos"],
        state=JobState(row["state"]),
        state_flags=_unflags(row["state_flags"]),
        reason=row["reason"],
        array_job_id=row["array_job_id"],
        array_task_id=row["array_task_id"],
        array_task_spec=row["array_task_spec"],
        array_max_tasks=row["array_max_tasks"],
        submit_time=row["submit_time"],
        eligible_time=row["eligible_time"],
        start_time=row["start_time"],
        end_time=row["end_time"],
        time_limit=_seconds(row["time_limit_s"]),
        cpus=row["cpus"],
        memory_mib=row["memory_mib"],
        node_count=row["node_count"],
        tasks=row["tasks"],
        gpus=GpuRequest(
            gpus=row["gpus"],
            per_node=row["gpus_per_node"],
            per_job=row["gpus_per_job"],
            per_task=row["gpus_per_task"],
            gpu_type=row["gpu_type"],
            shards=row["shards"],
            shards_per_node=row["shards_per_node"],
            sources=tuple(s for s in row["gpu_sources"].split(",") if s),
            mps=row.get("mps") or 0,
            mps_per_node=row.get("mps_per_node"),
        ),
        nodes=tuple(n for n in row["nodes"].split(",") if n),
        gpu_allocations=alloc,
        restart_count=row["restart_count"],
        requeue=bool(row["requeue"]),
        comment=row["comment"],
        admin_comment=row["admin_comment"],
        work_dir=row["work_dir"],
        command=row["command"],
        exit_code=row["exit_code"],
        batch=bool(row["batch"]),
    )


def node_to_row(node: Node) -> dict[str, Any]:
    """Return the ``nodes`` columns describing ``node``."""
    return {
        "name": node.name,
        "state": node.state,
        "state_flags": _flags(node.state_flags),
        "cpus": node.cpus,
        "cpus_allocated": node.cpus_allocated,
        "memory_mib": node.memory_mib,
        "memory_allocated_mib": node.memory_allocated_mib,
        "gpus": node.gpus,
        "gpu_type": node.gpu_type,
        "shards": node.shards,
        "gpus_used": node.gpus_used,
        "gpu_indices_used": ",".join(str(i) for i in node.gpu_indices_used),
        "shards_used": node.shards_used,
        "partitions": ",".join(node.partitions),
        "reason": node.reason,
        "address": node.address,
        "gpu_types": ",".join(f"{t}:{n}" for t, n in node.gpu_types),
        "mps": node.mps,
    }


def row_to_node(row: Mapping[Any, Any]) -> Node:
    """Return the Node a ``nodes`` row describes (inverse of :func:`node_to_row`)."""
    return Node(
        name=row["name"],
        state=row["state"],
        state_flags=_unflags(row["state_flags"]),
        cpus=row["cpus"],
        cpus_allocated=row["cpus_allocated"],
        memory_mib=row["memory_mib"],
        memory_allocated_mib=row["memory_allocated_mib"],
        gpus=row["gpus"],
        gpu_type=row["gpu_type"],
        shards=row["shards"],
        gpus_used=row["gpus_used"],
        gpu_indices_used=tuple(int(i) for i in row["gpu_indices_used"].split(",") if i),
        shards_used=row["shards_used"],
        partitions=tuple(p for p in row["partitions"].split(",") if p),
        reason=row["reason"],
        address=row["address"],
        gpu_types=_gpu_types(row.get("gpu_types") or ""),
        mps=row.get("mps") or 0,
    )


def _gpu_types(text: str) -> tuple[tuple[str, int], ...]:
    """``1g.10gb:4,3g.40gb:2`` (a ``nodes`` row's) → ``(("1g.10gb", 4), ("3g.40gb", 2))``."""
    out: list[tuple[str, int]] = []
    for item in text.split(","):
        name, _, count = item.rpartition(":")
        if name and count.isdigit():
            out.append((name, int(count)))
    return tuple(out)
