"""The efficiency report: what finished GPU jobs were given, what they used, what slurmgpu did.

Everything is aggregated in SQL (SQLite and PostgreSQL), never in Python loops over job
rows. The report gathers one row per finished GPU job of the window into a temporary
table (slurmgpu/report/job_rows.py: the job row joined with its end-of-job summary,
with per-job GPU-hours and flags computed in the SELECT), then runs each section's
GROUP BY over that table. The whole UTC days (day-bucketed windows) and whole hours of a
window are read from rollups instead (slurmgpu/report/rollup.py: a few rows per
bucket, rebuilt from the jobs when a trigger marked the bucket changed), and only the
partial hours at the two ends from the jobs: the figures are the same, a 30-day report
on a million jobs reads a few thousand rows instead of every job.

Definitions (also in docs/admin-guide.md):

- The window holds jobs that *ended* in ``[since, until)`` in a terminal state and asked
  for GPUs or shards; a job is counted whole in the window it ended in.
- GPU-hours allocated = GPU-equivalents x run time (slurmgpu/gpushare.py): a whole GPU
  counts 1, a MIG slice its compute slices out of 7 (``1g.10gb``: 1/7; 4 on an A30), a
  shard job ``shards / shards per GPU``, an MPS job ``mps / mps per GPU`` (the cluster's
  nodes tell the ratios: shards or mps / GPUs of the nodes that have both).
- GPU-hours used = allocated x the job's mean GPU utilisation (GPUs that sent no sample
  counted as 0 %); idle = allocated x the share of GPU-time spent idle (a GPU never busy
  for its whole run, a busy one from its last busy moment to the end); unused =
  allocated - used. Jobs without a usage summary (no agent ran) count in "allocated"
  only; efficiency = used / the allocated GPU-hours whose usage is known.
- Flags need a run of at least 5 min (jobstats' threshold); see :class:`ReportThresholds`.
- Queue wait = start - (eligible time, else submit time).
- Actions are the audit rows of the window; what they reclaimed is estimated per kind in
  :func:`_reclaimed` (upper bounds where the job's future is unknown).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import (
    Column,
    Connection,
    Engine,
    Float,
    Integer,
    MetaData,
    String,
    Table,
    and_,
    case,
    func,
    insert,
    literal,
    null,
    select,
)
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.sql.elements import ColumnElement

from slurmgpu.gpushare import DEFAULT_MPS_PER_GPU
from slurmgpu.report import rollup
from slurmgpu.report.energy_section import EnergySection, energy_section
from slurmgpu.report.job_rows import (
    FLAG_COLUMNS,
    FLAGS,
    GROUP_BY,
    SUMS,
    WAIT_EDGES_S,
    GroupBy,
    ReportThresholds,
    ShareRatios,
    cells_select,
    covers_most,
    fill_select,
    group_select,
    job_table,
    origin_of,
    positive,
)
from slurmgpu.store import schema
from slurmgpu.store.sql_dialect import epoch_s, floor_div

__all__ = [
    "FLAGS",
    "GROUP_BY",
    "ActionCount",
    "ActionPoint",
    "GroupBy",
    "GroupRow",
    "HistogramBin",
    "JobRow",
    "Reclaim",
    "Report",
    "ReportThresholds",
    "SeriesPoint",
    "WaitBin",
    "Waster",
    "build_report",
]

DEFAULT_SHARDS_PER_GPU = 16.0


@dataclass(frozen=True, slots=True)
class Figures:
    """GPU-hours and counts of a set of jobs."""

    jobs: int
    jobs_with_usage: int
    gpu_hours_allocated: float
    gpu_hours_with_usage: float  # allocated GPU-hours of the jobs whose usage is known
    gpu_hours_used: float
    gpu_hours_idle: float
    gpu_hours_unused: float
    jobs_flagged: int
    flags: dict[str, int]
    wait_mean_s: float | None
    wait_max_s: float | None

    @property
    def efficiency_pct(self) -> float | None:
        if self.gpu_hours_with_usage <= 0:
            return None
        return 100.0 * self.gpu_hours_used / self.gpu_hours_with_usage


@dataclass(frozen=True, slots=True)
class GroupRow:
    """One user, account or partition."""

    name: str
    figures: Figures


@dataclass(frozen=True, slots=True)
class JobRow:
    """One finished job, as the report lists it."""

    job_id: int
    name: str
    user: str
    account: str
    partition: str
    state: str
    gpus: float  # GPU-equivalents
    elapsed_s: float
    gpu_hours_allocated: float
    gpu_hours_used: float | None
    gpu_hours_idle: float | None
    gpu_hours_unused: float | None
    util_pct: float | None
    flags: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Waster:
    """A group that left the most allocated GPU-hours unused, and its worst jobs."""

    group: GroupRow
    worst: tuple[JobRow, ...]


@dataclass(frozen=True, slots=True)
class HistogramBin:
    """Jobs whose mean GPU utilisation is in ``[lo_pct, hi_pct)`` (None: unknown)."""

    lo_pct: float | None
    hi_pct: float | None
    jobs: int
    gpu_hours: float


@dataclass(frozen=True, slots=True)
class SeriesPoint:
    """GPU-hours of the jobs that ended in ``[start, start + bucket)``."""

    start: datetime
    jobs: int
    gpu_hours_allocated: float
    gpu_hours_with_usage: float
    gpu_hours_used: float
    gpu_hours_idle: float

    @property
    def efficiency_pct(self) -> float | None:
        if self.gpu_hours_with_usage <= 0:
            return None
        return 100.0 * self.gpu_hours_used / self.gpu_hours_with_usage


@dataclass(frozen=True, slots=True)
class WaitBin:
    """Jobs that waited ``[lo_s, hi_s)`` in the queue (``hi_s`` None: open)."""

    lo_s: float
    hi_s: float | None
    jobs: int


@dataclass(frozen=True, slots=True)
class ActionCount:
    policy: str
    kind: str
    mode: str
    outcome: str
    count: int


@dataclass(frozen=True, slots=True)
class ActionPoint:
    """Decisions recorded in ``[start, start + bucket)`` with one outcome."""

    start: datetime
    outcome: str
    count: int


@dataclass(frozen=True, slots=True)
class Reclaim:
    """What the executed actions of one policy and kind gave back (estimates).

    ``gpu_hours_returned``: GPU-hours other jobs could use because of the actions;
    ``reserved_gpu_hours_released``: GPU-hours of time-limit reservation given back to the
    scheduler (lets backfill start jobs sooner; not GPU-time anyone was using).
    ``estimated``: how many of ``actions`` had the numbers needed for an estimate.
    """

    policy: str
    kind: str
    actions: int
    estimated: int
    gpu_hours_returned: float
    reserved_gpu_hours_released: float


@dataclass(frozen=True, slots=True)
class Report:
    cluster: str
    since: datetime
    until: datetime
    by: GroupBy
    generated_at: datetime
    bucket_s: int
    shards_per_gpu: float
    thresholds: ReportThresholds
    totals: Figures
    groups: tuple[GroupRow, ...]
    wasters: tuple[Waster, ...]
    flagged: tuple[JobRow, ...]
    histogram: tuple[HistogramBin, ...]
    series: tuple[SeriesPoint, ...]
    waits: tuple[WaitBin, ...]
    actions: tuple[ActionCount, ...]
    action_series: tuple[ActionPoint, ...]
    reclaimed: tuple[Reclaim, ...]
    notes: tuple[str, ...] = field(default=())
    energy: EnergySection | None = None  # GPU energy per group (energy_section.py)
    mps_per_gpu: float = DEFAULT_MPS_PER_GPU  # gres/mps per GPU of the nodes


# -- the window's aggregates ------------------------------------------------------------


def _group_table() -> Table:
    """Per-group figures (a few hundred rows): the totals are sums over it."""
    return Table(
        "sgpu_report_groups",
        MetaData(),
        Column("grp", String(512)),
        *(Column(name, Float) for name in SUMS),
        Column("wait_sum", Float),
        Column("wait_n", Integer),
        Column("wait_max", Float),
        prefixes=["TEMPORARY"],
    )


def _cell_table() -> Table:
    """Jobs per (time bucket, utilisation bin, wait bin): the charts' small cube."""
    return Table(
        "sgpu_report_cells",
        MetaData(),
        Column("k", Integer),
        Column("hbin", Integer),
        Column("wbin", Integer),
        Column("jobs", Integer),
        Column("alloc", Float),
        Column("known", Float),
        Column("used", Float),
        Column("idle", Float),
        prefixes=["TEMPORARY"],
    )


def _figure_columns(g: Table) -> list[ColumnElement[Any]]:
    """The figures of the rows of ``g`` together (all, or per group with GROUP BY grp: a
    group has a row for the partial days and one for the whole days)."""
    return [
        *(func.coalesce(func.sum(g.c[name]), 0).label(name) for name in SUMS),
        (func.sum(g.c.wait_sum) / func.nullif(func.sum(g.c.wait_n), 0)).label("wait_mean"),
        func.max(g.c.wait_max).label("wait_max"),
    ]


def _figures(r: Any) -> Figures:
    return Figures(
        jobs=int(r.jobs),
        jobs_with_usage=int(r.jobs_with_usage),
        gpu_hours_allocated=float(r.alloc or 0.0),
        gpu_hours_with_usage=float(r.known or 0.0),
        gpu_hours_used=float(r.used or 0.0),
        gpu_hours_idle=float(r.idle or 0.0),
        gpu_hours_unused=float(r.unused or 0.0),
        jobs_flagged=int(r.flagged or 0),
        flags={name: int(getattr(r, col) or 0) for name, col in FLAG_COLUMNS.items()},
        wait_mean_s=None if r.wait_mean is None else float(r.wait_mean),
        wait_max_s=None if r.wait_max is None else float(r.wait_max),
    )


def _job_row(r: Any) -> JobRow:
    return JobRow(
        job_id=int(r.job_id),
        name=r.name or "",
        user=r.user or "",
        account=r.account or "",
        partition=r.partition or "",
        state=r.state or "",
        gpus=float(r.gpus or 0.0),
        elapsed_s=float(r.elapsed_s or 0.0),
        gpu_hours_allocated=float(r.alloc_h or 0.0),
        gpu_hours_used=None if r.used_h is None else float(r.used_h),
        gpu_hours_idle=None if r.idle_h is None else float(r.idle_h),
        gpu_hours_unused=None if r.waste_h is None else float(r.waste_h),
        util_pct=None if r.util_pct is None else float(r.util_pct),
        flags=tuple(name for name, col in FLAG_COLUMNS.items() if getattr(r, col)),
    )


def _share_ratios(conn: Connection, cluster: str) -> ShareRatios:
    """Shards and gres/mps per GPU on this cluster's nodes (each: its total / the GPUs of
    the nodes that have both; the defaults where no node has it)."""
    n = schema.nodes

    def per_gpu(units: Any, default: float) -> float:
        row = conn.execute(
            select(func.sum(units), func.sum(n.c.gpus)).where(
                n.c.cluster == cluster, units > 0, n.c.gpus > 0
            )
        ).one()
        if not row[0] or not row[1]:
            return default
        return float(row[0]) / float(row[1])

    return ShareRatios(
        shards_per_gpu=per_gpu(n.c.shards, DEFAULT_SHARDS_PER_GPU),
        mps_per_gpu=per_gpu(n.c.mps, DEFAULT_MPS_PER_GPU),
    )


def bucket_for(since: datetime, until: datetime) -> int:
    """Seconds per chart bucket: hours for windows up to three days, else days."""
    return 3600 if until - since <= timedelta(days=3) else 86400


def build_report(
    engine: Engine,
    *,
    since: datetime,
    until: datetime,
    cluster: str = "",
    by: GroupBy = "user",
    top: int = 10,
    worst: int = 3,
    flagged_limit: int = 20,
    thresholds: ReportThresholds | None = None,
    now: datetime | None = None,
    rollups: bool = True,
) -> Report:
    """Return the report of the jobs that ended in ``[since, until)`` and the actions then.

    ``rollups``: read the window's whole days (day-bucketed windows) and hours from the
    rollups, rebuilding the buckets that changed first; False reads every job (the same
    figures, slower: the tests compare the two).
    """
    if by not in GROUP_BY:
        raise ValueError(f"cannot group by {by!r}: use one of {', '.join(GROUP_BY)}")
    if until <= since:
        raise ValueError("the report's end must come after its start")
    th = thresholds or ReportThresholds()
    bucket = bucket_for(since, until)
    origin = origin_of(since, bucket)
    t, g, cells = job_table(), _group_table(), _cell_table()
    notes: list[str] = []
    with engine.connect() as conn:
        if conn.dialect.name == "sqlite":  # sorts and temporary tables in memory, not files,
            conn.exec_driver_sql("PRAGMA temp_store=MEMORY")  # and 64 MiB of page cache
            conn.exec_driver_sql("PRAGMA cache_size=-65536")
        ratio = _share_ratios(conn, cluster)
        split = None
        if rollups and worst <= rollup.WORST_KEEP and flagged_limit <= rollup.FLAGGED_KEEP:
            moment = until if now is None else now
            split, why_not = _fresh_rollups(conn, cluster, since, until, bucket, ratio, th, moment)
            notes.extend(why_not)
        ranges = split.partial if split is not None else ((since, until),)
        scan = covers_most(conn, ranges)
        for table in (t, g, cells):
            table.drop(conn, checkfirst=True)
            table.create(conn)
        try:
            if ranges:
                fill = fill_select(cluster, ranges, by, ratio, th, bucket, origin, scan)
                conn.execute(insert(t).from_select([c.name for c in t.columns], fill))
                # Two passes over the jobs: per group, and per chart cell.
                conn.execute(insert(g).from_select([c.name for c in g.columns], group_select(t)))
                conn.execute(
                    insert(cells).from_select([c.name for c in cells.columns], cells_select(t))
                )
            if split is not None and split.pieces:
                rollup.add_groups(conn, g, cluster, split, by)
                rollup.add_cells(conn, cells, cluster, split, origin, bucket)
            totals = _figures(conn.execute(select(*_figure_columns(g))).one())
            groups = tuple(
                GroupRow(str(r.grp or ""), _figures(r))
                for r in conn.execute(
                    select(g.c.grp, *_figure_columns(g))
                    .group_by(g.c.grp)
                    .order_by(func.sum(g.c.alloc).desc(), g.c.grp)
                )
            )
            wasters = _wasters(conn, t, cluster, split, by, groups, top, worst)
            candidates = rollup.flagged_candidates(t, cluster, split).subquery()
            flagged = tuple(
                _job_row(r)
                for r in conn.execute(
                    select(candidates)
                    .order_by(
                        func.coalesce(candidates.c.waste_h, candidates.c.alloc_h).desc(),
                        candidates.c.job_id,
                    )
                    .limit(flagged_limit)
                )
            )
            histogram = _histogram(conn, cells)
            series = _series(conn, cells, since, until, bucket)
            waits = _waits(conn, cells)
        finally:
            for table in (t, g, cells):
                table.drop(conn, checkfirst=True)
            conn.rollback()
        actions, action_series = _actions(conn, cluster, since, until, bucket)
        reclaimed = _reclaimed(conn, cluster, since, until, until if now is None else now)
        energy = energy_section(conn, cluster, since, until, by)
        conn.rollback()
    if totals.jobs and totals.jobs_with_usage < totals.jobs:
        notes.append(
            f"{totals.jobs - totals.jobs_with_usage} of {totals.jobs} jobs have no usage "
            "summary (no agent reported for them): counted in allocated GPU-hours only"
        )
    return Report(
        cluster=cluster,
        since=since,
        until=until,
        by=by,
        generated_at=now or datetime.now(UTC),
        bucket_s=bucket,
        shards_per_gpu=ratio.shards_per_gpu,
        mps_per_gpu=ratio.mps_per_gpu,
        thresholds=th,
        totals=totals,
        groups=groups,
        wasters=wasters,
        flagged=flagged,
        histogram=histogram,
        series=series,
        waits=waits,
        actions=actions,
        action_series=action_series,
        reclaimed=reclaimed,
        notes=tuple(notes),
        energy=energy,
    )


def _fresh_rollups(
    conn: Connection,
    cluster: str,
    since: datetime,
    until: datetime,
    bucket: int,
    ratio: ShareRatios,
    th: ReportThresholds,
    now: datetime,
) -> tuple[rollup.Split | None, list[str]]:
    """The window's split into whole buckets and partial hours once the buckets' rollups
    are fresh; None (and why, for the report's notes) when they cannot be trusted or
    built. Day rollups serve only day-bucketed windows (an hourly chart needs hours)."""
    split = rollup.split_window(since, until, days=bucket == rollup.DAY_S)
    if not split.pieces:
        return None, []
    if not rollup.triggers_present(conn):
        conn.rollback()
        return None, [
            "this store has no report rollups (run `sgpu db upgrade`): every job of the "
            "window was read, which is slow on large stores"
        ]
    try:
        rollup.refresh(conn, cluster, split, ratio, th, now)
    except SQLAlchemyError as exc:  # a read-only store, a lock held too long
        conn.rollback()
        cause = str(getattr(exc, "orig", None) or exc).splitlines()[0]
        return None, [
            f"the report rollups could not be brought up to date ({cause}): every job "
            "of the window was read instead"
        ]
    return split, []


def _wasters(
    conn: Connection,
    t: Table,
    cluster: str,
    split: rollup.Split | None,
    by: GroupBy,
    groups: Sequence[GroupRow],
    top: int,
    worst: int,
) -> tuple[Waster, ...]:
    ranked_groups = sorted(
        (g for g in groups if g.figures.gpu_hours_unused > 0),
        key=lambda g: (-g.figures.gpu_hours_unused, g.name),
    )[:top]
    if not ranked_groups:
        return ()
    names = [g.name for g in ranked_groups]
    candidates = rollup.worst_candidates(t, cluster, split, by, names).subquery()
    c = candidates.c
    rank = (
        func.row_number()
        .over(partition_by=c.grp, order_by=(c.waste_h.desc(), c.job_id))
        .label("rank")
    )
    ranked = select(candidates, rank).subquery()
    rows = conn.execute(
        select(ranked).where(ranked.c.rank <= worst).order_by(ranked.c.grp, ranked.c.rank)
    ).all()
    by_group: dict[str, list[JobRow]] = {}
    for r in rows:  # at most top x worst rows
        by_group.setdefault(str(r.grp or ""), []).append(_job_row(r))
    return tuple(Waster(g, tuple(by_group.get(g.name, ()))) for g in ranked_groups)


def _histogram(conn: Connection, c: Table) -> tuple[HistogramBin, ...]:
    """Ten 10 %-wide bins of mean GPU utilisation (100 % in the last), then unknown."""
    counts = {
        int(r.hbin): (int(r.jobs), float(r.hours or 0.0))
        for r in conn.execute(
            select(c.c.hbin, func.sum(c.c.jobs).label("jobs"), func.sum(c.c.alloc).label("hours"))
            .group_by(c.c.hbin)
            .order_by(c.c.hbin)
        )
    }
    out = [HistogramBin(10.0 * i, 10.0 * (i + 1), *counts.get(i, (0, 0.0))) for i in range(10)]
    if -1 in counts:
        out.append(HistogramBin(None, None, *counts[-1]))
    return tuple(out)


def _series(
    conn: Connection, c: Table, since: datetime, until: datetime, bucket: int
) -> tuple[SeriesPoint, ...]:
    origin = origin_of(since, bucket)
    found = {
        int(r.k): SeriesPoint(
            start=datetime.fromtimestamp(origin + int(r.k) * bucket, UTC),
            jobs=int(r.jobs),
            gpu_hours_allocated=float(r.alloc or 0.0),
            gpu_hours_with_usage=float(r.known or 0.0),
            gpu_hours_used=float(r.used or 0.0),
            gpu_hours_idle=float(r.idle or 0.0),
        )
        for r in conn.execute(
            select(
                c.c.k,
                func.sum(c.c.jobs).label("jobs"),
                func.sum(c.c.alloc).label("alloc"),
                func.sum(c.c.known).label("known"),
                func.sum(c.c.used).label("used"),
                func.sum(c.c.idle).label("idle"),
            )
            .group_by(c.c.k)
            .order_by(c.c.k)
        )
    }
    # Every bucket of the window, empty ones too, so a chart's time axis has no gaps.
    buckets = math.ceil((until.timestamp() - origin) / bucket)
    return tuple(
        found.get(k)
        or SeriesPoint(datetime.fromtimestamp(origin + k * bucket, UTC), 0, 0.0, 0.0, 0.0, 0.0)
        for k in range(buckets)
    )


def _waits(conn: Connection, c: Table) -> tuple[WaitBin, ...]:
    counts = {
        int(r.wbin): int(r.jobs)
        for r in conn.execute(select(c.c.wbin, func.sum(c.c.jobs).label("jobs")).group_by(c.c.wbin))
    }
    edges: list[float] = [0.0, *map(float, WAIT_EDGES_S)]
    return tuple(
        WaitBin(edges[i], edges[i + 1] if i + 1 < len(edges) else None, counts.get(i, 0))
        for i in range(len(edges))
    )


def _actions(
    conn: Connection, cluster: str, since: datetime, until: datetime, bucket: int
) -> tuple[tuple[ActionCount, ...], tuple[ActionPoint, ...]]:
    a = schema.actions
    window = and_(a.c.cluster == cluster, a.c.at >= since, a.c.at < until)
    counts = tuple(
        ActionCount(r.policy, r.kind, r.mode, r.outcome, int(r.n))
        for r in conn.execute(
            select(a.c.policy, a.c.kind, a.c.mode, a.c.outcome, func.count().label("n"))
            .where(window)
            .group_by(a.c.policy, a.c.kind, a.c.mode, a.c.outcome)
            .order_by(a.c.policy, a.c.kind, a.c.mode, a.c.outcome)
        )
    )
    origin = math.floor(since.timestamp() / bucket) * bucket
    key = floor_div(epoch_s(a.c.at) - literal(float(origin)), literal(float(bucket))).label("k")
    points = tuple(
        ActionPoint(datetime.fromtimestamp(origin + int(r.k) * bucket, UTC), r.outcome, int(r.n))
        for r in conn.execute(
            select(key, a.c.outcome, func.count().label("n"))
            .where(window)
            .group_by(key, a.c.outcome)
            .order_by(key, a.c.outcome)
        )
    )
    return counts, points


def _reclaimed(
    conn: Connection, cluster: str, since: datetime, until: datetime, now: datetime
) -> tuple[Reclaim, ...]:
    """GPU-hours the executed actions (outcome ``done``) of the window gave back.

    - ``idle_gpu`` requeue/cancel: the idle GPUs x what was left of the job's time limit
      when it was stopped (an upper bound: the job could have ended sooner); the run's
      start is the newest RUNNING event of the job before the action.
    - ``rightsize`` updates of the GPU count: (GPUs before - after) x the job's run time;
      of the time limit: GPUs x (limit before - after), counted as reservation released.
    - ``colocate`` packing: (1 - shards given / shards per GPU) x the job's run time.
    - ``malleable`` resizes (transactions that reached ``running`` at a smaller size):
      (GPUs before - after) x the time from the resize to the job's end (or ``now``).
    Run times are those of the job as stored (finished jobs; running ones until ``now``).
    """
    a, j, ev = schema.actions, schema.jobs, schema.job_events
    job_row = (
        select(func.max(j.c.id))
        .where(j.c.cluster == a.c.cluster, j.c.job_id == a.c.job_id)
        .correlate(a)
        .scalar_subquery()
    )
    n = a.c.numbers
    done = (
        select(
            a.c.policy,
            a.c.kind,
            a.c.alert,
            a.c.at,
            epoch_s(a.c.at).label("at_s"),
            job_row.label("job_row"),
            n["idle_gpus"].as_float().label("idle_gpus"),
            n["gpus_current"].as_float().label("gpus_current"),
            n["gpus_proposed"].as_float().label("gpus_proposed"),
            n["time_limit_current_s"].as_float().label("limit_before"),
            n["time_limit_proposed_s"].as_float().label("limit_after"),
            n["shards_proposed"].as_float().label("shards_proposed"),
            n["shards_per_gpu"].as_float().label("shards_per_gpu"),
        )
        .where(
            a.c.cluster == cluster,
            a.c.at >= since,
            a.c.at < until,
            a.c.outcome == "done",
            a.c.job_id.is_not(None),
        )
        .subquery("d")
    )
    d = done.c
    run_start = (
        select(func.max(ev.c.at))
        .where(ev.c.job_row == d.job_row, ev.c.to_state == "RUNNING", ev.c.at <= d.at)
        .correlate(done)
        .scalar_subquery()
    )
    now_s = literal(now.timestamp())
    job_end = case((j.c.end_time.is_(None), now_s), else_=epoch_s(j.c.end_time))
    run_h = positive(job_end - epoch_s(j.c.start_time)) / literal(3600.0)
    left_h = positive(j.c.time_limit_s - (d.at_s - epoch_s(run_start))) / literal(3600.0)
    idle_gpu = and_(d.policy == "idle_gpu", d.kind.in_(("requeue", "cancel")))
    gpus_cut = and_(d.policy == "rightsize", d.gpus_current > d.gpus_proposed)
    packed = and_(d.policy == "colocate", d.kind == "update", d.shards_per_gpu > 0)
    returned = case(
        (and_(idle_gpu, d.idle_gpus > 0, j.c.time_limit_s > 0), d.idle_gpus * left_h),
        (and_(gpus_cut, j.c.start_time.is_not(None)), (d.gpus_current - d.gpus_proposed) * run_h),
        (
            and_(packed, d.shards_proposed > 0, j.c.start_time.is_not(None)),
            (literal(1.0) - d.shards_proposed / d.shards_per_gpu) * run_h,
        ),
        else_=null(),
    )
    gpus_now = case((j.c.gpus > 0, j.c.gpus * literal(1.0)), else_=literal(1.0))
    reserved = case(
        (
            and_(d.policy == "rightsize", d.limit_before > d.limit_after),
            gpus_now * (d.limit_before - d.limit_after) / literal(3600.0),
        ),
        else_=null(),
    )
    stmt = (
        select(
            d.policy,
            d.kind,
            func.count().label("n"),
            func.count(func.coalesce(returned, reserved)).label("estimated"),
            func.coalesce(func.sum(returned), 0.0).label("returned"),
            func.coalesce(func.sum(reserved), 0.0).label("reserved"),
        )
        .select_from(done.outerjoin(j, j.c.id == d.job_row))
        .group_by(d.policy, d.kind)
        .order_by(d.policy, d.kind)
    )
    out = [
        Reclaim(r.policy, r.kind, int(r.n), int(r.estimated), float(r.returned), float(r.reserved))
        for r in conn.execute(stmt)
    ]
    out.extend(_resized(conn, cluster, since, until, now))
    return tuple(out)


def _resized(
    conn: Connection, cluster: str, since: datetime, until: datetime, now: datetime
) -> list[Reclaim]:
    t, j = schema.transactions, schema.jobs
    p = t.c.payload
    from_gpus, to_gpus = p["from_gpus"].as_float(), p["to_gpus"].as_float()
    job_row = (
        select(func.max(j.c.id))
        .where(j.c.cluster == t.c.cluster, j.c.job_id == t.c.job_id)
        .correlate(t)
        .scalar_subquery()
    )
    shrunk = (
        select(
            t.c.updated_at,
            (from_gpus - to_gpus).label("cut"),
            job_row.label("job_row"),
        )
        .where(
            t.c.cluster == cluster,
            t.c.kind == "resize",
            t.c.state == "running",
            t.c.updated_at >= since,
            t.c.updated_at < until,
            from_gpus > to_gpus,
        )
        .subquery("r")
    )
    r = shrunk.c
    end = case((j.c.end_time.is_(None), literal(now.timestamp())), else_=epoch_s(j.c.end_time))
    hours = r.cut * positive(end - epoch_s(r.updated_at)) / literal(3600.0)
    row = conn.execute(
        select(
            func.count().label("n"),
            func.count(j.c.id).label("estimated"),
            func.coalesce(func.sum(case((j.c.id.is_(None), null()), else_=hours)), 0.0).label(
                "returned"
            ),
        ).select_from(shrunk.outerjoin(j, j.c.id == r.job_row))
    ).one()
    if not row.n:
        return []
    return [
        Reclaim("malleable", "shrink", int(row.n), int(row.estimated), float(row.returned), 0.0)
    ]
