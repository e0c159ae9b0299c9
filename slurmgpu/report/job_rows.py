"""The report's per-job SQL: one row per finished GPU job, with its GPU-hours, flags and bins.

:func:`fill_select` reads the jobs that ended in some time ranges, joined with their
end-of-job summaries, and computes everything the report needs per job (see
:mod:`slurmgpu.report.build` for the definitions). Its rows go into the temporary
:func:`job_table`; :func:`group_select` and :func:`cells_select` aggregate that table, for
a report's window (slurmgpu/report/build.py) or for the per-day rollups
(slurmgpu/report/rollup.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from sqlalchemy import (
    Column,
    Connection,
    Float,
    Integer,
    MetaData,
    String,
    Table,
    and_,
    case,
    func,
    literal,
    null,
    or_,
    select,
)
from sqlalchemy.sql.elements import ColumnElement

from slurmgpu.gpushare import DEFAULT_MPS_PER_GPU, mig_sql_patterns
from slurmgpu.model import JobState
from slurmgpu.store import schema
from slurmgpu.store.sql_dialect import epoch_s, floor_div, unindexed

__all__ = [
    "FLAGS",
    "FLAG_COLUMNS",
    "GROUP_BY",
    "SUMS",
    "TERMINAL_STATES",
    "WAIT_EDGES_S",
    "GroupBy",
    "ReportThresholds",
    "ShareRatios",
    "cells_select",
    "covers_most",
    "fill_select",
    "gpu_equivalents",
    "group_select",
    "job_columns",
    "job_table",
    "origin_of",
    "positive",
]

GroupBy = Literal["user", "account", "partition"]
GROUP_BY: tuple[GroupBy, ...] = ("user", "account", "partition")
TERMINAL_STATES = tuple(s.value for s in JobState if s.is_terminal)
FLAGS = ("idle", "low-util", "over-time", "over-memory", "over-gpus")
FLAG_COLUMNS = {
    "idle": "flag_idle",
    "low-util": "flag_low_util",
    "over-time": "flag_time",
    "over-memory": "flag_memory",
    "over-gpus": "flag_gpus",
}
# Upper edges of the queue-wait bins, seconds (the last bin is open).
WAIT_EDGES_S = (60, 600, 3600, 6 * 3600)


@dataclass(frozen=True, slots=True)
class ReportThresholds:
    """When a finished job is flagged (jobstats' and Job Defense Shield's defaults).

    >>> ReportThresholds().low_util_pct
    15.0
    """

    min_runtime_s: float = 300.0  # shorter runs are never flagged
    idle_gpu_hours: float = 1.0  # idle: at least this much GPU-time idle (the idle policy's 60 min)
    low_util_pct: float = 15.0  # low-util: mean GPU util at or below
    time_min_elapsed_s: float = 900.0  # over-time: COMPLETED, ran longer than this, and
    time_use_pct: float = 60.0  # used less than this share of its time limit
    memory_use_pct: float = 70.0  # over-memory: peak below this share of --mem


@dataclass(frozen=True, slots=True)
class ShareRatios:
    """Shares of one GPU on this cluster's nodes: shards and gres/mps per GPU (the nodes
    that have both tell; 16 shards and 100 MPS where none does)."""

    shards_per_gpu: float
    mps_per_gpu: float = DEFAULT_MPS_PER_GPU


def gpu_equivalents(
    gpus: ColumnElement[Any],
    gpu_type: ColumnElement[Any],
    shards: ColumnElement[Any],
    mps: ColumnElement[Any],
    ratios: ShareRatios,
) -> ColumnElement[Any]:
    """A job's GPUs as GPU-equivalents in SQL (slurmgpu/gpushare.py): whole GPUs, MIG
    slices by their compute slices, shards and MPS by their share of a GPU."""
    mig = case(
        *((gpu_type.like(pattern), literal(fraction)) for pattern, fraction in mig_sql_patterns()),
        else_=literal(1.0),
    )
    return case(
        (gpus > 0, gpus * mig),
        (shards > 0, shards / literal(float(ratios.shards_per_gpu))),
        else_=mps / literal(float(ratios.mps_per_gpu)),
    )


# -- the per-job table ------------------------------------------------------------------


def job_table() -> Table:
    """A temporary table of the window's jobs (a fresh MetaData: not part of the schema)."""
    return Table(
        "sgpu_report_jobs",
        MetaData(),
        Column("row_id", Integer, primary_key=True),
        Column("job_id", Integer, nullable=False),
        Column("name", String(256)),
        Column("user", String(64)),
        Column("account", String(64)),
        Column("partition", String(512)),
        Column("state", String(24)),
        Column("grp", String(512)),
        Column("gpus", Float),
        Column("elapsed_s", Float),
        Column("end_s", Float),
        Column("wait_s", Float),
        Column("util_pct", Float),
        Column("alloc_h", Float),
        Column("known_h", Float),  # alloc_h when usage is known, else 0
        Column("used_h", Float),
        Column("idle_h", Float),
        Column("waste_h", Float),
        Column("flag_idle", Integer),
        Column("flag_low_util", Integer),
        Column("flag_time", Integer),
        Column("flag_memory", Integer),
        Column("flag_gpus", Integer),
        Column("flagged", Integer),
        Column("k", Integer),  # time bucket of the job's end
        Column("hbin", Integer),  # utilisation bin: 0-9, -1 unknown
        Column("wbin", Integer),  # queue-wait bin: 0-4, -1 unknown
        prefixes=["TEMPORARY"],
    )


# Summed per group: figure name -> column of the job table (None: count of rows).
SUMS: dict[str, str | None] = {
    "jobs": None,
    "jobs_with_usage": "util_pct",
    "alloc": "alloc_h",
    "known": "known_h",
    "used": "used_h",
    "idle": "idle_h",
    "unused": "waste_h",
    "flagged": "flagged",
    **{col: col for col in FLAG_COLUMNS.values()},
}


def positive(x: ColumnElement[Any]) -> ColumnElement[Any]:
    return case((x > 0, x), else_=literal(0.0))


def fill_select(
    cluster: str,
    ranges: Sequence[tuple[datetime, datetime]],
    by: GroupBy,
    ratios: ShareRatios,
    th: ReportThresholds,
    bucket: int,
    origin: int,
    scan: bool,
) -> Any:
    """The rows of :func:`job_table` for the jobs that ended in one of ``ranges``
    (``[start, end)`` each), grouped by ``by``; ``k`` counts ``bucket`` s from ``origin``."""
    j, s = schema.jobs, schema.job_summaries
    # The job's summary is the one written after this run started: an earlier run's (a
    # requeued job) or an older job's with the same id (slurmctld lost its state) came
    # before. A join, not a "newest summary" subquery: 1.4x faster on SQLite.
    summary_of_run = and_(
        s.c.cluster == j.c.cluster,
        s.c.job_id == j.c.job_id,
        s.c.created_at >= j.c.start_time,
    )
    start = epoch_s(j.c.start_time)
    end = epoch_s(j.c.end_time)
    # A window holding most of the table is read faster in table order than through the
    # end_time index (random reads, 3-4x slower on SQLite): see covers_most.
    ended = unindexed(j.c.end_time) if scan else j.c.end_time
    queued = epoch_s(func.coalesce(j.c.eligible_time, j.c.submit_time))
    base = (
        select(
            j.c.id.label("row_id"),
            j.c.job_id,
            j.c.name,
            j.c.user,
            j.c.account,
            j.c.partition,
            j.c.state,
            j.c[by].label("grp"),
            gpu_equivalents(j.c.gpus, j.c.gpu_type, j.c.shards, j.c.mps, ratios).label("gpus"),
            positive(end - start).label("elapsed_s"),
            end.label("end_s"),
            case(
                (func.coalesce(j.c.eligible_time, j.c.submit_time).is_(None), null()),
                else_=positive(start - queued),
            ).label("wait_s"),
            j.c.time_limit_s,
            j.c.memory_mib,
            j.c.gpus.label("whole_gpus"),
            s.c.gpu_util_pct.label("util_pct"),
            s.c.gpu_idle_pct,
            s.c.gpus_reported,
            s.c.gpus_busy,
            s.c.cpu_memory_max_mib,
        )
        .select_from(j.outerjoin(s, summary_of_run))
        .where(
            j.c.cluster == cluster,
            or_(*(and_(ended >= lo, ended < hi) for lo, hi in ranges)),
            j.c.state.in_(TERMINAL_STATES),
            j.c.start_time.is_not(None),
            or_(j.c.gpus > 0, j.c.shards > 0, j.c.mps > 0),
        )
        # Computed once per job: flattened into the outer query, every use of elapsed_s
        # below would recompute the timestamps and the summary lookup (10x slower).
        .cte("b")
        .prefix_with("MATERIALIZED")
    )
    alloc = base.c.gpus * base.c.elapsed_s / literal(3600.0)
    per_job = select(base, alloc.label("alloc_h")).subquery("p")
    p = per_job.c
    used = p.alloc_h * p.util_pct / literal(100.0)
    idle = p.alloc_h * p.gpu_idle_pct / literal(100.0)
    long_enough = p.elapsed_s >= th.min_runtime_s
    flags = {
        "flag_idle": and_(long_enough, idle >= th.idle_gpu_hours),
        "flag_low_util": and_(long_enough, p.util_pct <= th.low_util_pct),
        "flag_time": and_(
            long_enough,
            p.state == JobState.COMPLETED.value,
            p.time_limit_s > 0,
            p.elapsed_s > th.time_min_elapsed_s,
            p.elapsed_s * literal(100.0) < p.time_limit_s * th.time_use_pct,
        ),
        "flag_memory": and_(
            long_enough,
            p.memory_mib > 0,
            p.cpu_memory_max_mib.is_not(None),
            p.cpu_memory_max_mib * literal(100.0) < p.memory_mib * th.memory_use_pct,
        ),
        "flag_gpus": and_(
            long_enough,
            p.whole_gpus >= 2,
            p.gpus_reported >= p.whole_gpus,
            p.gpus_busy >= 1,
            p.gpus_busy < p.whole_gpus,
        ),
    }
    flag_cols = {name: case((cond, 1), else_=0) for name, cond in flags.items()}
    return select(
        p.row_id,
        p.job_id,
        p.name,
        p.user,
        p.account,
        p.partition,
        p.state,
        p.grp,
        p.gpus,
        p.elapsed_s,
        p.end_s,
        p.wait_s,
        p.util_pct,
        p.alloc_h,
        case((p.util_pct.is_(None), literal(0.0)), else_=p.alloc_h).label("known_h"),
        used.label("used_h"),
        idle.label("idle_h"),
        (p.alloc_h - used).label("waste_h"),
        *(col.label(name) for name, col in flag_cols.items()),
        case((or_(*flags.values()), 1), else_=0).label("flagged"),
        floor_div(p.end_s - literal(float(origin)), literal(float(bucket))).label("k"),
        case(
            (p.util_pct.is_(None), -1),
            (p.util_pct >= 90, 9),
            (p.util_pct <= 0, 0),
            else_=floor_div(p.util_pct, literal(10.0)),
        ).label("hbin"),
        case(
            (p.wait_s.is_(None), -1),
            *((p.wait_s < edge, i) for i, edge in enumerate(WAIT_EDGES_S)),
            else_=len(WAIT_EDGES_S),
        ).label("wbin"),
    )


def origin_of(since: datetime, bucket: int) -> int:
    return math.floor(since.timestamp() / bucket) * bucket


# -- aggregates -------------------------------------------------------------------------


def group_select(t: Table, *keys: ColumnElement[Any]) -> Any:
    """Figures of ``t``'s jobs per ``keys`` (default: per ``grp``), in :data:`SUMS` order."""
    keys = keys or (t.c.grp,)
    sums = [
        (func.count() if col is None else func.count(t.c[col]) if name == "jobs_with_usage"
         else func.coalesce(func.sum(t.c[col]), 0)).label(name)
        for name, col in SUMS.items()
    ]  # fmt: skip
    return select(
        *keys,
        *sums,
        func.sum(t.c.wait_s).label("wait_sum"),
        func.count(t.c.wait_s).label("wait_n"),
        func.max(t.c.wait_s).label("wait_max"),
    ).group_by(*keys)


def job_columns(t: Table) -> list[Any]:
    c = t.c
    return [
        c.job_id,
        c.name,
        c.user,
        c.account,
        c.partition,
        c.state,
        c.gpus,
        c.elapsed_s,
        c.alloc_h,
        c.used_h,
        c.idle_h,
        c.waste_h,
        c.util_pct,
        *(c[col] for col in FLAG_COLUMNS.values()),
    ]


def cells_select(t: Table) -> Any:
    return select(
        t.c.k,
        t.c.hbin,
        t.c.wbin,
        func.count(),
        func.coalesce(func.sum(t.c.alloc_h), 0.0),
        func.coalesce(func.sum(t.c.known_h), 0.0),
        func.coalesce(func.sum(t.c.used_h), 0.0),
        func.coalesce(func.sum(t.c.idle_h), 0.0),
    ).group_by(t.c.k, t.c.hbin, t.c.wbin)


def covers_most(conn: Connection, ranges: Sequence[tuple[datetime, datetime]]) -> bool:
    """True when the jobs that ended in ``ranges`` are at least a quarter of all jobs
    (counts on indexes): the whole table is then read in order instead of through
    end_time."""
    j = schema.jobs
    total = conn.execute(select(func.count()).select_from(j)).scalar() or 0
    inside = sum(
        conn.execute(
            select(func.count()).select_from(j).where(j.c.end_time >= lo, j.c.end_time < hi)
        ).scalar()
        or 0
        for lo, hi in ranges
    )
    return total > 0 and 4 * inside >= total
