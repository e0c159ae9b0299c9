"""Finished jobs as the priors learn from them: the jobs table joined with summaries."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Engine, and_, select

from slurmgpu.model import JobState
from slurmgpu.policy.base import HistoryRecord
from slurmgpu.store import schema
from slurmgpu.store.schema import as_utc

_FINISHED = [s.value for s in JobState if s.is_terminal and s is not JobState.UNKNOWN]


def _from_summary(summary: Mapping[str, Any] | None) -> dict[str, float | int | None]:
    """Peak memory, mean CPU, GPU util, peak GPU memory and GPUs used, from a summary."""
    if not summary:
        return {}
    peak_mem = peak_node = cpu = None
    utils: list[float] = []
    gpu_mem: list[float] = []
    used = 0
    for node in (summary.get("nodes") or {}).values():
        host = node.get("host") or {}
        if host.get("memory_max_mib") is not None:
            node_peak = float(host["memory_max_mib"])
            peak_mem = (peak_mem or 0.0) + node_peak  # the job's total over its nodes
            peak_node = max(peak_node or 0.0, node_peak)
        if host.get("cpu_pct_mean") is not None:
            cpu = (cpu or 0.0) + float(host["cpu_pct_mean"])
        for gpu in (node.get("gpus") or {}).values():
            if gpu.get("util_pct_mean") is not None:
                utils.append(float(gpu["util_pct_mean"]))
            if gpu.get("memory_max_mib") is not None:
                gpu_mem.append(float(gpu["memory_max_mib"]))
            if not gpu.get("never_busy", True):
                used += 1
    return {
        "peak_memory_mib": peak_mem,
        "peak_node_memory_mib": peak_node,
        "mean_cpu_pct": cpu,
        "mean_gpu_util_pct": sum(utils) / len(utils) if utils else None,
        "peak_gpu_memory_mib": max(gpu_mem) if gpu_mem else None,
        "gpus_used": used if utils else None,
    }


def load_history(engine: Engine, cluster: str, since: datetime) -> list[HistoryRecord]:
    """Return finished jobs that ended after ``since``, with their usage when known.

    User, name, partition and state strings are interned: a history holds few distinct
    ones, and the daemon reloads it every few minutes. One object per distinct string
    keeps 200,000 records small, and the priors' grouping and their comparison with the
    last reload (``Priors.carry_over``) then hash and compare by identity.
    """
    intern = sys.intern
    j, s = schema.jobs, schema.job_summaries
    stmt = (
        select(
            j.c.job_id,
            j.c.user,
            j.c.name,
            j.c.partition,
            j.c.state,
            j.c.start_time,
            j.c.end_time,
            j.c.time_limit_s,
            j.c.gpus,
            j.c.cpus,
            j.c.memory_mib,
            j.c.restart_count,
            s.c.summary,
        )
        .select_from(j.outerjoin(s, and_(s.c.cluster == j.c.cluster, s.c.job_id == j.c.job_id)))
        .where(
            and_(
                j.c.cluster == cluster,
                j.c.state.in_(_FINISHED),
                j.c.end_time >= since,
                j.c.start_time.is_not(None),
            )
        )
        .order_by(j.c.end_time)
    )
    out = []
    with engine.connect() as conn:
        for r in conn.execute(stmt).mappings():
            start, end = as_utc(r["start_time"]), as_utc(r["end_time"])
            usage = _from_summary(r["summary"])
            out.append(
                HistoryRecord(
                    user=intern(r["user"]),
                    name=intern(r["name"]),
                    partition=intern(r["partition"]),
                    script_hash=None,
                    state=intern(r["state"]),
                    run_time=max(end - start, timedelta(0)),
                    time_limit=timedelta(seconds=r["time_limit_s"])
                    if r["time_limit_s"] is not None
                    else None,
                    gpus_requested=int(r["gpus"]),
                    gpus_used=_int(usage.get("gpus_used")),
                    cpus=int(r["cpus"]),
                    memory_requested_mib=r["memory_mib"],
                    peak_memory_mib=_float(usage.get("peak_memory_mib")),
                    peak_node_memory_mib=_float(usage.get("peak_node_memory_mib")),
                    mean_cpu_pct=_float(usage.get("mean_cpu_pct")),
                    mean_gpu_util_pct=_float(usage.get("mean_gpu_util_pct")),
                    peak_gpu_memory_mib=_float(usage.get("peak_gpu_memory_mib")),
                    ended_at=end,
                    restarts=int(r["restart_count"] or 0),
                )
            )
    return out


def _float(v: float | int | None) -> float | None:
    return None if v is None else float(v)


def _int(v: float | int | None) -> int | None:
    return None if v is None else int(v)
