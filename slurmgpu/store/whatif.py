"""What ``sgpu whatif`` reads from the store: the GPU jobs that ended in a window.

:func:`read_window` returns, for every finished GPU job (whole GPUs or shards) whose end
falls in ``[since, until)``, what it asked for (GPUs, shards, time limit, memory, user,
partition, submit/start/end) and what its end-of-job summary says it used (mean GPU
util, busy GPUs, GPU memory peak, GPU energy), plus the GPUs per stored node (the site's
shape). Plain values only: the simulator turns them into a trace
(:mod:`slurmgpu.sim.fromstore`) without importing the store.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Engine, and_, or_, select

from slurmgpu.store import schema

__all__ = ["StoredRun", "WindowRead", "read_window"]

_CHUNK = 500


@dataclass(frozen=True, slots=True)
class StoredRun:
    """One finished job as asked for and as used (usage fields None: no summary)."""

    job_id: int
    name: str
    user: str
    account: str
    partition: str
    gpus: int
    shards: int
    time_limit_s: float | None
    memory_mib: float | None
    submit_s: float
    start_s: float
    end_s: float
    util_pct: float | None = None
    gpus_busy: int | None = None
    gpu_memory_max_mib: float | None = None
    energy_j: float | None = None

    @property
    def has_usage(self) -> bool:
        return self.util_pct is not None


@dataclass(frozen=True, slots=True)
class WindowRead:
    """The window's jobs, oldest submit first, and the stored nodes' GPU counts."""

    runs: tuple[StoredRun, ...]
    node_gpus: tuple[int, ...] = ()
    shards_per_gpu: tuple[int, ...] = field(default=())


def _utc(at: datetime) -> datetime:
    return at.replace(tzinfo=UTC) if at.tzinfo is None else at.astimezone(UTC)


def read_window(engine: Engine, cluster: str, since: datetime, until: datetime) -> WindowRead:
    """Read the finished GPU jobs that ended in ``[since, until)`` (see the module doc)."""
    j, s, n = schema.jobs, schema.job_summaries, schema.nodes
    stmt = (
        select(j)
        .where(
            and_(
                j.c.cluster == cluster,
                j.c.end_time >= since,
                j.c.end_time < until,
                j.c.start_time.is_not(None),
                or_(j.c.gpus > 0, j.c.shards > 0),
            )
        )
        .order_by(j.c.job_id, j.c.id)
    )
    newest: dict[int, dict[str, Any]] = {}
    with engine.connect() as conn:
        for got in conn.execute(stmt).mappings():
            newest[int(got["job_id"])] = dict(got)  # a requeued job: its newest row wins
        summaries: dict[int, dict[str, Any]] = {}
        ids = sorted(newest)
        for i in range(0, len(ids), _CHUNK):
            chunk = ids[i : i + _CHUNK]
            q = (
                select(
                    s.c.job_id,
                    s.c.created_at,
                    s.c.gpu_util_pct,
                    s.c.gpus_busy,
                    s.c.gpu_memory_max_mib,
                    s.c.energy_j,
                )
                .where(and_(s.c.cluster == cluster, s.c.job_id.in_(chunk)))
                .order_by(s.c.id)
            )
            for found in conn.execute(q).mappings():
                r = dict(found)
                job = newest[int(r["job_id"])]
                began = job["start_time"]
                # a summary made before this run started belongs to an earlier run
                if isinstance(began, datetime) and _utc(r["created_at"]) < _utc(began):
                    continue
                summaries[int(r["job_id"])] = dict(r)
        nodes = conn.execute(
            select(n.c.gpus, n.c.shards).where(and_(n.c.cluster == cluster, n.c.gpus > 0))
        ).all()
    runs: list[StoredRun] = []
    for job_id, row in newest.items():
        start = _utc(row["start_time"])
        end = _utc(row["end_time"])
        submit_at = row["submit_time"] or row["start_time"]
        submit = _utc(submit_at)
        summ = summaries.get(job_id)
        limit = row["time_limit_s"]
        mem = row["memory_mib"]
        runs.append(
            StoredRun(
                job_id=job_id,
                name=str(row["name"] or f"job{job_id}"),
                user=str(row["user"] or "unknown"),
                account=str(row["account"] or ""),
                partition=str(row["partition"] or "gpu"),
                gpus=int(row["gpus"] or 0),
                shards=int(row["shards"] or 0),
                time_limit_s=float(limit) if limit is not None else None,
                memory_mib=float(mem) if mem is not None else None,
                submit_s=min(submit, start).timestamp(),
                start_s=start.timestamp(),
                end_s=max(start, end).timestamp(),
                util_pct=_num(summ, "gpu_util_pct"),
                gpus_busy=None
                if summ is None or summ["gpus_busy"] is None
                else int(summ["gpus_busy"]),
                gpu_memory_max_mib=_num(summ, "gpu_memory_max_mib"),
                energy_j=_num(summ, "energy_j"),
            )
        )
    runs.sort(key=lambda r: (r.submit_s, r.job_id))
    return WindowRead(
        tuple(runs),
        tuple(int(g) for g, _ in nodes),
        tuple(int(sh) // int(g) for g, sh in nodes if sh),
    )


def _num(row: dict[str, Any] | None, key: str) -> float | None:
    if row is None:
        return None
    value = row.get(key)
    return float(value) if isinstance(value, (int, float)) else None
