"""Per-day rollups of the report: a window's whole UTC days read from a few rows per day.

A 30-day report on a million jobs spent nearly all its time reading every job of the
window, joined with its summary. For windows measured in days (hour-bucketed windows of
up to three days read the jobs), the report now reads, for each whole day of the window,
rows that hold what it would have computed from that day's jobs:

- ``report_day_groups``: the figures per (day, user, account, partition); a window's
  groups and totals are their sums (every figure is a sum, a count or a maximum);
- ``report_day_cells``: jobs and GPU-hours per (day, utilisation bin, queue-wait bin), for
  the histogram, the daily series and the waits;
- ``report_day_jobs``: each day's :data:`FLAGGED_KEEP` most wasteful flagged jobs and each
  group's :data:`WORST_KEEP` worst jobs; the window's top N (N up to those) is among its
  days' top N under the same order, so the lists stay exact.

Only the partial days at the window's ends are read from the jobs. The rows are a cache:
triggers (migration 0006) mark a day in ``report_dirty`` when a finished job of that day
or a summary of such a job is written, changed or deleted, and :func:`refresh` rebuilds
dirty days, days never built and days built with other settings (the shard ratio of the
nodes or the flag thresholds: ``report_days.fingerprint``) before the report reads them,
with the same SQL that reads the jobs (:func:`~slurmgpu.report.report_jobs.fill_select`).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    Connection,
    Table,
    and_,
    delete,
    func,
    insert,
    literal,
    select,
    text,
    union_all,
)
from sqlalchemy.sql.elements import ColumnElement

from slurmgpu.report.report_jobs import (
    GROUP_BY,
    GroupBy,
    ReportThresholds,
    cells_select,
    covers_most,
    fill_select,
    group_select,
    job_columns,
    job_table,
)
from slurmgpu.store import schema

__all__ = [
    "DAY_S",
    "FLAGGED_KEEP",
    "WORST_KEEP",
    "DaySplit",
    "add_cells",
    "add_groups",
    "fingerprint",
    "flagged_candidates",
    "refresh",
    "split_days",
    "triggers_present",
    "worst_candidates",
]

DAY_S = 86400
FLAGGED_KEEP = 50  # per day; a report listing more flagged jobs reads the jobs
WORST_KEEP = 5  # per day and group; likewise for more worst jobs per waster
# Bumped when what a rollup row holds changes: every day is then rebuilt on first use.
ROLLUP_VERSION = 1
TRIGGERS = (
    "report_dirty_jobs_insert",
    "report_dirty_jobs_update",
    "report_dirty_jobs_delete",
    "report_dirty_summaries_insert",
    "report_dirty_summaries_update",
    "report_dirty_summaries_delete",
)
_PG_LOCK = 0x5347505552  # "SGPUR": one rollup refresh at a time on PostgreSQL


@dataclass(frozen=True, slots=True)
class DaySplit:
    """A window as whole UTC days ``[first, last)`` (day numbers) and the rest."""

    first: int
    last: int
    partial: tuple[tuple[datetime, datetime], ...]  # read from the jobs

    @property
    def has_days(self) -> bool:
        return self.last > self.first


def _moment(day: int) -> datetime:
    return datetime.fromtimestamp(day * DAY_S, UTC)


def split_days(since: datetime, until: datetime) -> DaySplit:
    """The whole days of ``[since, until)`` and the partial ranges at its ends.

    >>> s = split_days(datetime(2026, 3, 1, 12, tzinfo=UTC), datetime(2026, 3, 4, tzinfo=UTC))
    >>> (s.last - s.first, [(a.day, a.hour, b.day, b.hour) for a, b in s.partial])
    (2, [(1, 12, 2, 0)])
    """
    first = math.ceil(since.timestamp() / DAY_S)
    last = math.floor(until.timestamp() / DAY_S)
    if last <= first:
        return DaySplit(first, first, ((since, until),))
    partial = []
    if since < _moment(first):
        partial.append((since, _moment(first)))
    if _moment(last) < until:
        partial.append((_moment(last), until))
    return DaySplit(first, last, tuple(partial))


def fingerprint(shards_per_gpu: float, th: ReportThresholds) -> str:
    """What a day's rollup was computed with; another value means rebuild it."""
    settings = f"v{ROLLUP_VERSION} {shards_per_gpu!r} {th!r} {FLAGGED_KEEP} {WORST_KEEP}"
    return hashlib.sha256(settings.encode()).hexdigest()


def triggers_present(conn: Connection) -> bool:
    """True when the dirty-day triggers exist (a store migrated to 0006, and no later
    SQLite table rebuild dropped them): without them the rollups cannot be trusted."""
    names = ", ".join(f"'{name}'" for name in TRIGGERS)
    dialect = conn.dialect.name
    if dialect == "sqlite":
        query = f"SELECT count(*) FROM sqlite_master WHERE type = 'trigger' AND name IN ({names})"
    elif dialect == "postgresql":
        query = f"SELECT count(*) FROM pg_trigger WHERE NOT tgisinternal AND tgname IN ({names})"
    else:
        return False
    return conn.execute(text(query)).scalar() == len(TRIGGERS)


def _runs(days: Sequence[int]) -> Iterator[tuple[int, int]]:
    """Sorted day numbers as ``[first, last)`` runs of consecutive days."""
    start = prev = None
    for day in days:
        if prev is not None and day == prev + 1:
            prev = day
            continue
        if start is not None and prev is not None:
            yield start, prev + 1
        start = prev = day
    if start is not None and prev is not None:
        yield start, prev + 1


def refresh(
    conn: Connection, cluster: str, split: DaySplit, shards_per_gpu: float, th: ReportThresholds
) -> int:
    """Rebuild the rollups of the window's days that are dirty, missing or stale; commit.

    Returns how many days were rebuilt. The dirty marks of a day are deleted in the same
    transaction that reads its jobs, before reading them: a job written meanwhile marks
    the day again (SQLite: it waits for this writer; PostgreSQL: its mark waits on the
    deleted row), so no change is lost.
    """
    days, dirty = schema.report_days, schema.report_dirty
    fp = fingerprint(shards_per_gpu, th)
    if conn.dialect.name == "postgresql":
        conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_LOCK})
    in_window = and_(days.c.cluster == cluster, days.c.day >= split.first, days.c.day < split.last)
    built = {
        int(d)
        for d in conn.execute(
            select(days.c.day).where(in_window, days.c.fingerprint == fp)
        ).scalars()
    }
    marked = {
        int(d)
        for d in conn.execute(
            select(dirty.c.day).where(
                dirty.c.cluster == cluster, dirty.c.day >= split.first, dirty.c.day < split.last
            )
        ).scalars()
    }
    stale = sorted((set(range(split.first, split.last)) - built) | marked)
    if not stale:
        conn.rollback()
        return 0
    t = job_table()
    t.drop(conn, checkfirst=True)
    for lo, hi in _runs(stale):
        in_run = and_(dirty.c.cluster == cluster, dirty.c.day >= lo, dirty.c.day < hi)
        conn.execute(delete(dirty).where(in_run))  # first: see the docstring
        for table in (schema.report_day_groups, schema.report_day_cells, schema.report_day_jobs):
            conn.execute(
                delete(table).where(table.c.cluster == cluster, table.c.day >= lo, table.c.day < hi)
            )
        conn.execute(
            delete(days).where(days.c.cluster == cluster, days.c.day >= lo, days.c.day < hi)
        )
        t.create(conn)
        start, end = _moment(lo), _moment(hi)
        scan = covers_most(conn, [(start, end)])
        # k = the day number: buckets of a day from the epoch.
        fill = fill_select(cluster, [(start, end)], "user", shards_per_gpu, th, DAY_S, 0, scan)
        conn.execute(insert(t).from_select([c.name for c in t.columns], fill))
        _build_days(conn, t, cluster)
        now = datetime.now(UTC)
        conn.execute(
            insert(days),
            [
                {"cluster": cluster, "day": d, "fingerprint": fp, "built_at": now}
                for d in range(lo, hi)
            ],
        )
        t.drop(conn)
    conn.commit()
    return len(stale)


def _build_days(conn: Connection, t: Table, cluster: str) -> None:
    """Aggregate the per-job table ``t`` (``k`` = day number) into the rollup tables."""
    g, c, dj = schema.report_day_groups, schema.report_day_cells, schema.report_day_jobs
    keys = (t.c.k, t.c.user, t.c.account, t.c.partition)
    groups = group_select(t, *keys).subquery()
    figures = [c.name for c in groups.c if c.name not in ("k", "user", "account", "partition")]
    conn.execute(
        insert(g).from_select(
            ["cluster", "day", "user", "account", "partition", *figures],
            select(literal(cluster), *(groups.c[name] for name in ("k", "user", "account",
                   "partition", *figures))),
        )
    )  # fmt: skip
    conn.execute(
        insert(c).from_select(
            ["cluster", "day", "hbin", "wbin", "jobs", "alloc", "known", "used", "idle"],
            select(literal(cluster), cells_select(t).subquery()),
        )
    )
    job_cols = [col.name for col in job_columns(t)]
    lists: list[tuple[str, ColumnElement[Any] | None, int]] = [
        ("flagged", None, FLAGGED_KEEP),
        *((by, t.c[by], WORST_KEEP) for by in GROUP_BY),
    ]
    for name, grp, keep in lists:
        if grp is None:
            order: tuple[Any, ...] = (func.coalesce(t.c.waste_h, t.c.alloc_h).desc(), t.c.job_id)
            where: tuple[ColumnElement[bool], ...] = (t.c.flagged == 1,)
            partition: tuple[Any, ...] = (t.c.k,)
        else:
            order = (t.c.waste_h.desc(), t.c.job_id)
            where = (t.c.waste_h.is_not(None), t.c.waste_h > 0)
            partition = (t.c.k, grp)
        # Ranked on narrow rows (sorting whole job rows was 3x slower), then joined back.
        rank = func.row_number().over(partition_by=partition, order_by=order).label("rank")
        ranked = select(t.c.row_id, rank).where(*where).subquery()
        conn.execute(
            insert(dj).from_select(
                ["cluster", "day", "list", "grp", *job_cols],
                select(
                    literal(cluster),
                    t.c.k,
                    literal(name),
                    literal(None) if grp is None else grp,
                    *(t.c[col] for col in job_cols),
                )
                .select_from(t.join(ranked, ranked.c.row_id == t.c.row_id))
                .where(ranked.c.rank <= keep),
            )
        )


def add_groups(conn: Connection, g: Table, cluster: str, split: DaySplit, by: GroupBy) -> None:
    """Add the window's whole days to the per-group table ``g`` (one row per group)."""
    r = schema.report_day_groups
    sums = [name for name in (c.name for c in g.columns) if name not in ("grp", "wait_max")]
    conn.execute(
        insert(g).from_select(
            ["grp", *sums, "wait_max"],
            select(
                r.c[by],
                *(func.sum(r.c[name]) for name in sums),
                func.max(r.c.wait_max),
            )
            .where(r.c.cluster == cluster, r.c.day >= split.first, r.c.day < split.last)
            .group_by(r.c[by]),
        )
    )


def add_cells(conn: Connection, cells: Table, cluster: str, split: DaySplit, origin: int) -> None:
    """Add the window's whole days to the chart cells (``k`` = days from ``origin``)."""
    r = schema.report_day_cells
    names = ["hbin", "wbin", "jobs", "alloc", "known", "used", "idle"]
    conn.execute(
        insert(cells).from_select(
            ["k", *names],
            select(r.c.day - literal(origin // DAY_S), *(r.c[n] for n in names)).where(
                r.c.cluster == cluster, r.c.day >= split.first, r.c.day < split.last
            ),
        )
    )


def _day_jobs(cluster: str, split: DaySplit, name: str) -> tuple[Table, ColumnElement[bool]]:
    dj = schema.report_day_jobs
    where = and_(
        dj.c.cluster == cluster,
        dj.c.list == name,
        dj.c.day >= split.first,
        dj.c.day < split.last,
    )
    return dj, where


def worst_candidates(
    t: Table, cluster: str, split: DaySplit | None, by: GroupBy, names: Sequence[str]
) -> Any:
    """Jobs that may be the worst of the groups ``names``: the partial days' from ``t``,
    the whole days' from their lists."""
    partial = select(t.c.grp, *job_columns(t)).where(
        t.c.grp.in_(names), t.c.waste_h.is_not(None), t.c.waste_h > 0
    )
    if split is None or not split.has_days:
        return partial
    dj, where = _day_jobs(cluster, split, by)
    return union_all(partial, select(dj.c.grp, *job_columns(dj)).where(where, dj.c.grp.in_(names)))


def flagged_candidates(t: Table, cluster: str, split: DaySplit | None) -> Any:
    """Flagged jobs that may be among the window's most wasteful."""
    flag = select(*job_columns(t)).where(t.c.flagged == 1)
    if split is None or not split.has_days:
        return flag
    dj, where = _day_jobs(cluster, split, "flagged")
    return union_all(flag, select(*job_columns(dj)).where(where))
