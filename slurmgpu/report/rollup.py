"""Per-day and per-hour rollups of the report: a window read from a few rows per bucket.

A 30-day report on a million jobs spent nearly all its time reading every job of the
window, joined with its summary. Now the report reads, for each whole UTC day of the
window (windows bucketed by day) and each whole hour of the rest, rows that hold what it
would have computed from that bucket's jobs:

- ``report_rollup_groups``: the figures per (bucket, user, account, partition); a
  window's groups and totals are their sums (every figure is a sum, a count or a max);
- ``report_rollup_cells``: jobs and GPU-hours per (bucket, utilisation bin, queue-wait
  bin), for the histogram, the series and the waits;
- ``report_rollup_jobs``: each bucket's :data:`FLAGGED_KEEP` most wasteful flagged jobs
  and each group's :data:`WORST_KEEP` worst jobs; the window's top N (N up to those) is
  among its buckets' top N under the same order, so the lists stay exact.

Only the partial hours at the window's two ends are read from the jobs. The rows are a
cache: triggers (migration 0006) mark a day and an hour in ``report_dirty`` when a
finished job of theirs or its summary is written, changed or deleted, and
:func:`refresh` rebuilds marked buckets, buckets never built and buckets built with
other settings (the nodes' shard ratio, the flag thresholds:
``report_built.fingerprint``) before the report reads them, with the same SQL that reads
the jobs (:func:`~slurmgpu.report.job_rows.fill_select`). In steady state only the
last hour or so is rebuilt (jobs ending now, summaries arriving).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import (
    Connection,
    Table,
    and_,
    bindparam,
    delete,
    func,
    insert,
    literal,
    not_,
    or_,
    select,
    text,
    union_all,
)
from sqlalchemy.sql.elements import ColumnElement

from slurmgpu.report.job_rows import (
    GROUP_BY,
    GroupBy,
    ReportThresholds,
    ShareRatios,
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
    "HOURS_KEPT",
    "HOUR_S",
    "WORST_KEEP",
    "Piece",
    "Split",
    "add_cells",
    "add_groups",
    "fingerprint",
    "flagged_candidates",
    "refresh",
    "split_window",
    "triggers_present",
    "worst_candidates",
]

DAY_S = 86400
HOUR_S = 3600
FLAGGED_KEEP = 50  # per bucket; a report listing more flagged jobs reads the jobs
# Hour rollups serve the partial days at a window's ends: those older than this before the
# report's moment are dropped when a refresh writes (rebuilt if a window needs them again),
# so they do not grow for ever (their job lists can hold a few rows per job).
HOURS_KEPT = timedelta(days=45)
WORST_KEEP = 5  # per bucket and group; likewise for more worst jobs per waster
# Bumped when what a rollup row holds changes: every bucket is then rebuilt on first use.
ROLLUP_VERSION = 2  # 2: MIG slices and MPS as GPU-equivalents (issue 39)
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
class Piece:
    """Buckets ``[first, last)`` of ``span`` seconds (bucket n starts at n x span)."""

    span: int
    first: int
    last: int

    def where(self, table: Table) -> ColumnElement[bool]:
        c = table.c
        return and_(c.span == self.span, c.bucket >= self.first, c.bucket < self.last)


@dataclass(frozen=True, slots=True)
class Split:
    """A window as whole buckets (read from rollups) and partial ranges (from the jobs)."""

    pieces: tuple[Piece, ...]
    partial: tuple[tuple[datetime, datetime], ...]

    def where(self, table: Table, cluster: str) -> ColumnElement[bool]:
        return and_(table.c.cluster == cluster, or_(*(p.where(table) for p in self.pieces)))


def _moment(seconds: int) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)


def split_window(since: datetime, until: datetime, *, days: bool) -> Split:
    """``[since, until)`` as whole UTC days (when ``days``), whole hours in the rest, and
    the partial hours left at the ends.

    >>> s = split_window(datetime(2026, 3, 1, 12, 30, tzinfo=UTC),
    ...                  datetime(2026, 3, 4, 2, 10, tzinfo=UTC), days=True)
    >>> [(p.span, p.last - p.first) for p in s.pieces]
    [(86400, 2), (3600, 11), (3600, 2)]
    >>> [(a.hour, a.minute, b.hour, b.minute) for a, b in s.partial]
    [(12, 30, 13, 0), (2, 0, 2, 10)]
    """
    lo_s, hi_s = since.timestamp(), until.timestamp()
    pieces: list[Piece] = []
    ends = [(lo_s, hi_s)]
    d0, d1 = math.ceil(lo_s / DAY_S), math.floor(hi_s / DAY_S)
    if days and d1 > d0:
        pieces.append(Piece(DAY_S, d0, d1))
        ends = [(lo_s, d0 * DAY_S), (d1 * DAY_S, hi_s)]
    partial: list[tuple[float, float]] = []
    for lo, hi in ends:
        if hi <= lo:
            continue
        h0, h1 = math.ceil(lo / HOUR_S), math.floor(hi / HOUR_S)
        if h1 <= h0:
            partial.append((lo, hi))
            continue
        pieces.append(Piece(HOUR_S, h0, h1))
        if lo < h0 * HOUR_S:
            partial.append((lo, h0 * HOUR_S))
        if h1 * HOUR_S < hi:
            partial.append((h1 * HOUR_S, hi))
    exact = {lo_s: since, hi_s: until}  # the window's own ends keep their microseconds
    return Split(
        tuple(pieces),
        tuple(
            (exact.get(a) or _moment(int(a)), exact.get(b) or _moment(int(b))) for a, b in partial
        ),
    )


def fingerprint(ratios: ShareRatios, th: ReportThresholds) -> str:
    """What a bucket's rollup was computed with; another value means rebuild it."""
    shares = f"{ratios.shards_per_gpu!r} {ratios.mps_per_gpu!r}"
    settings = f"v{ROLLUP_VERSION} {shares} {th!r} {FLAGGED_KEEP} {WORST_KEEP}"
    return hashlib.sha256(settings.encode()).hexdigest()


def triggers_present(conn: Connection) -> bool:
    """True when the dirty-day triggers exist (a store migrated to 0006, and no later
    SQLite table rebuild dropped them): without them the rollups cannot be trusted."""
    dialect = conn.dialect.name
    if dialect == "sqlite":
        query = "SELECT count(*) FROM sqlite_master WHERE type = 'trigger' AND name IN :names"
    elif dialect == "postgresql":
        query = "SELECT count(*) FROM pg_trigger WHERE NOT tgisinternal AND tgname IN :names"
    else:
        return False
    stmt = text(query).bindparams(bindparam("names", expanding=True))
    return conn.execute(stmt, {"names": list(TRIGGERS)}).scalar() == len(TRIGGERS)


def _runs(buckets: Sequence[int]) -> Iterator[tuple[int, int]]:
    """Sorted bucket numbers as ``[first, last)`` runs of consecutive buckets."""
    start = prev = None
    for n in buckets:
        if prev is not None and n == prev + 1:
            prev = n
            continue
        if start is not None and prev is not None:
            yield start, prev + 1
        start = prev = n
    if start is not None and prev is not None:
        yield start, prev + 1


def refresh(
    conn: Connection,
    cluster: str,
    split: Split,
    ratios: ShareRatios,
    th: ReportThresholds,
    now: datetime,
) -> int:
    """Rebuild the window's buckets that are marked, missing or stale; commit.

    Hour rollups older than :data:`HOURS_KEPT` before ``now`` (other than this window's)
    are dropped in the same transaction.

    Returns how many buckets were rebuilt. The marks of a bucket are deleted in the same
    transaction that reads its jobs, before reading them: a job written meanwhile marks
    the bucket again (SQLite: it waits for this writer; PostgreSQL: its mark waits on
    the deleted row), so no change is lost.
    """
    built, dirty = schema.report_built, schema.report_dirty
    fp = fingerprint(ratios, th)
    if conn.dialect.name == "postgresql":
        conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_LOCK})
    stale: list[tuple[int, list[int]]] = []
    for piece in split.pieces:
        fresh = set(
            conn.execute(
                select(built.c.bucket).where(
                    built.c.cluster == cluster, piece.where(built), built.c.fingerprint == fp
                )
            ).scalars()
        )
        marked = set(
            conn.execute(
                select(dirty.c.bucket).where(dirty.c.cluster == cluster, piece.where(dirty))
            ).scalars()
        )
        todo = sorted((set(range(piece.first, piece.last)) - fresh) | marked)
        if todo:
            stale.append((piece.span, todo))
    if not stale:
        conn.rollback()
        return 0
    t = job_table()
    t.drop(conn, checkfirst=True)
    rows = (schema.report_rollup_groups, schema.report_rollup_cells, schema.report_rollup_jobs)
    for span, buckets in stale:
        for lo, hi in _runs(buckets):
            run = Piece(span, lo, hi)
            conn.execute(delete(dirty).where(dirty.c.cluster == cluster, run.where(dirty)))
            for table in (*rows, built):
                conn.execute(delete(table).where(table.c.cluster == cluster, run.where(table)))
            t.create(conn)
            start, end = _moment(lo * span), _moment(hi * span)
            scan = covers_most(conn, [(start, end)])
            # k = the bucket number: buckets of span seconds from the epoch.
            fill = fill_select(cluster, [(start, end)], "user", ratios, th, span, 0, scan)
            conn.execute(insert(t).from_select([c.name for c in t.columns], fill))
            _build(conn, t, cluster, span)
            now = datetime.now(UTC)
            conn.execute(
                insert(built),
                [
                    {"cluster": cluster, "span": span, "bucket": n, "fingerprint": fp,
                     "built_at": now}
                    for n in range(lo, hi)
                ],
            )  # fmt: skip
            t.drop(conn)
    cutoff = int((now - HOURS_KEPT).timestamp()) // HOUR_S
    for table in (*rows, built, dirty):
        c = table.c
        conn.execute(
            delete(table).where(
                c.cluster == cluster,
                c.span == HOUR_S,
                c.bucket < cutoff,
                *(not_(p.where(table)) for p in split.pieces if p.span == HOUR_S),
            )
        )
    conn.commit()
    return sum(len(b) for _, b in stale)


def _build(conn: Connection, t: Table, cluster: str, span: int) -> None:
    """Aggregate the per-job table ``t`` (``k`` = bucket number) into the rollup tables."""
    g, c = schema.report_rollup_groups, schema.report_rollup_cells
    dj = schema.report_rollup_jobs
    keys = (t.c.k, t.c.user, t.c.account, t.c.partition)
    groups = group_select(t, *keys).subquery()
    figures = [x.name for x in groups.c if x.name not in ("k", "user", "account", "partition")]
    head: list[ColumnElement[Any]] = [literal(cluster), literal(span)]
    conn.execute(
        insert(g).from_select(
            ["cluster", "span", "bucket", "user", "account", "partition", *figures],
            select(*head, *(groups.c[name] for name in ("k", "user", "account", "partition",
                                                        *figures))),
        )
    )  # fmt: skip
    conn.execute(
        insert(c).from_select(
            ["cluster", "span", "bucket", "hbin", "wbin", "jobs", "alloc", "known", "used", "idle"],
            select(*head, cells_select(t).subquery()),
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
        # Ranked on narrow rows (the ranking sorts every job), then joined back.
        rank = func.row_number().over(partition_by=partition, order_by=order).label("rank")
        ranked = select(t.c.row_id, rank).where(*where).subquery()
        conn.execute(
            insert(dj).from_select(
                ["cluster", "span", "bucket", "list", "grp", *job_cols],
                select(
                    *head,
                    t.c.k,
                    literal(name),
                    literal(None) if grp is None else grp,
                    *(t.c[col] for col in job_cols),
                )
                .select_from(t.join(ranked, ranked.c.row_id == t.c.row_id))
                .where(ranked.c.rank <= keep),
            )
        )


def add_groups(conn: Connection, g: Table, cluster: str, split: Split, by: GroupBy) -> None:
    """Add the window's whole buckets to the per-group table ``g`` (a row per group)."""
    r = schema.report_rollup_groups
    sums = [name for name in (c.name for c in g.columns) if name not in ("grp", "wait_max")]
    conn.execute(
        insert(g).from_select(
            ["grp", *sums, "wait_max"],
            select(
                r.c[by],
                *(func.sum(r.c[name]) for name in sums),
                func.max(r.c.wait_max),
            )
            .where(split.where(r, cluster))
            .group_by(r.c[by]),
        )
    )


def add_cells(
    conn: Connection, cells: Table, cluster: str, split: Split, origin: int, bucket: int
) -> None:
    """Add the window's whole buckets to the chart cells (``k``: ``bucket`` s from
    ``origin``; a rollup bucket lies inside one chart bucket)."""
    r = schema.report_rollup_cells
    names = ["hbin", "wbin", "jobs", "alloc", "known", "used", "idle"]
    k = (r.c.bucket * r.c.span - literal(origin)) // literal(bucket)
    conn.execute(
        insert(cells).from_select(
            ["k", *names], select(k, *(r.c[n] for n in names)).where(split.where(r, cluster))
        )
    )


def worst_candidates(
    t: Table, cluster: str, split: Split | None, by: GroupBy, names: Sequence[str]
) -> Any:
    """Jobs that may be the worst of the groups ``names``: the partial hours' from ``t``,
    the whole buckets' from their lists."""
    partial = select(t.c.grp, *job_columns(t)).where(
        t.c.grp.in_(names), t.c.waste_h.is_not(None), t.c.waste_h > 0
    )
    if split is None or not split.pieces:
        return partial
    dj = schema.report_rollup_jobs
    return union_all(
        partial,
        select(dj.c.grp, *job_columns(dj)).where(
            split.where(dj, cluster), dj.c.list == by, dj.c.grp.in_(names)
        ),
    )


def flagged_candidates(t: Table, cluster: str, split: Split | None) -> Any:
    """Flagged jobs that may be among the window's most wasteful."""
    flag = select(*job_columns(t)).where(t.c.flagged == 1)
    if split is None or not split.pieces:
        return flag
    dj = schema.report_rollup_jobs
    return union_all(
        flag, select(*job_columns(dj)).where(split.where(dj, cluster), dj.c.list == "flagged")
    )
