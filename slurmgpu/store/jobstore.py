"""Reads and writes of jobs, job events, nodes, GPUs and submissions.

All writes of one observe cycle happen in one transaction: a cycle is stored whole or
not at all. Only bound parameters reach the database.

SQLite stores any string in a ``String(n)`` column, NUL characters included, and any
64-bit integer in an ``Integer`` one. PostgreSQL (and other servers) refuse such a row,
and one refused row would fail every later observe cycle too, so on those databases rows
are first made to fit (:class:`RowFitter`): NULs dropped, strings cut to the column's
length, integers outside ``Integer``'s 32 bits stored as NULL (or clamped when the column
is NOT NULL), each with one warning per column. SQLite rows are written untouched.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, ClassVar

from sqlalchemy import (
    BigInteger,
    Engine,
    Integer,
    String,
    Table,
    and_,
    bindparam,
    func,
    insert,
    select,
    update,
)
from sqlalchemy.exc import SQLAlchemyError

from slurmgpu.jobdiff import JobDiff
from slurmgpu.model import Job, Node
from slurmgpu.store import schema
from slurmgpu.store.database import StoreError
from slurmgpu.store.health import classify, one_line, sqlite_file
from slurmgpu.store.rows import job_to_row, node_to_row, row_to_job, row_to_node
from slurmgpu.store.submission_record import SKEW, submission_row

_CHUNK = 500
_INT32 = (-(2**31), 2**31 - 1)
_INT64 = (-(2**63), 2**63 - 1)

log = logging.getLogger("slurmgpu.store")


class RowFitter:
    """Makes row dicts of one table fit a database that enforces types (not SQLite).

    ``fit`` returns the row itself when nothing needed changing, else a fixed copy.
    """

    _warned: ClassVar[set[tuple[str, str]]] = set()  # one warning per column per process

    def __init__(self, table: Table, *, lenient: bool = False) -> None:
        """``lenient``: SQLite, which stores any string and 32-bit values in INTEGER but
        still cannot hold an integer beyond 64 bits; only that is fitted there."""
        self.table = table.name
        self.strings: dict[str, int | None] = {}
        self.ints: dict[str, tuple[bool, tuple[int, int]]] = {}  # column → nullable, range
        for col in table.columns:
            if lenient:
                if isinstance(col.type, Integer):
                    self.ints[col.name] = (bool(col.nullable), _INT64)
                continue
            if isinstance(col.type, String):
                self.strings[col.name] = col.type.length
            elif isinstance(col.type, BigInteger):
                self.ints[col.name] = (bool(col.nullable), _INT64)
            elif isinstance(col.type, Integer):
                self.ints[col.name] = (bool(col.nullable), _INT32)

    def fit(self, row: dict[str, Any]) -> dict[str, Any]:
        fixed: dict[str, Any] | None = None
        for name, length in self.strings.items():
            value = row.get(name)
            if type(value) is not str:
                continue
            new = value.replace("\x00", "") if "\x00" in value else value
            if length is not None and len(new) > length:
                new = new[:length]
            if new is not value:
                self._warn(name, f"cut to {length} characters" if length else "NUL removed")
                fixed = fixed if fixed is not None else dict(row)
                fixed[name] = new
        for name, (nullable, (lo, hi)) in self.ints.items():
            value = row.get(name)
            if type(value) is not int or lo <= value <= hi:
                continue
            self._warn(name, "out of the column's range, stored as NULL" if nullable else "clamped")
            fixed = fixed if fixed is not None else dict(row)
            fixed[name] = None if nullable else max(lo, min(hi, value))
        return row if fixed is None else fixed

    def _warn(self, column: str, what: str) -> None:
        key = (self.table, column)
        if key not in RowFitter._warned:
            RowFitter._warned.add(key)
            log.warning("%s.%s: a value did not fit the column (%s)", self.table, column, what)


_FITTERS: dict[str, RowFitter] = {}


def _fitted(conn: Any, table: Table, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` as the database will accept them (on SQLite only integers past 64 bits)."""
    lenient = conn.dialect.name == "sqlite"
    key = f"{table.name}:{lenient}"
    fitter = _FITTERS.get(key)
    if fitter is None:
        fitter = _FITTERS[key] = RowFitter(table, lenient=lenient)
    return [fitter.fit(r) for r in rows]


@dataclass(frozen=True, slots=True)
class StoredJob:
    """A job as the store knows it: the model plus our bookkeeping."""

    row_id: int
    job: Job
    cluster: str
    first_seen: datetime
    last_seen: datetime
    gone: bool


def _chunks(items: Sequence[Any], size: int = _CHUNK) -> Iterable[Sequence[Any]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


class JobStore:
    """The store's job-facing API, bound to one cluster label."""

    def __init__(self, engine: Engine, cluster: str = "") -> None:
        self.engine = engine
        self.cluster = cluster

    # -- reads ---------------------------------------------------------------

    def active_jobs(self) -> dict[int, tuple[int, Job]]:
        """Return job id → (row id, Job) for every job not yet gone (the observer's memory)."""
        j = schema.jobs
        stmt = select(j).where(and_(j.c.cluster == self.cluster, j.c.gone.is_(False)))
        out: dict[int, tuple[int, Job]] = {}
        with self.engine.connect() as conn:
            for row in conn.execute(stmt).mappings():
                out[int(row["job_id"])] = (int(row["id"]), row_to_job(row))
        return out

    def known_nodes(self) -> dict[str, Node]:
        """Return the nodes as last stored (to write only nodes that changed)."""
        n = schema.nodes
        with self.engine.connect() as conn:
            rows = conn.execute(select(n).where(n.c.cluster == self.cluster)).mappings()
            return {r["name"]: row_to_node(r) for r in rows}

    def jobs(
        self,
        *,
        states: Sequence[str] | None = None,
        user: str | None = None,
        job_ids: Sequence[int] | None = None,
        array_job_id: int | None = None,
        array_task_id: int | None = None,
        include_gone: bool = True,
        limit: int | None = None,
    ) -> list[StoredJob]:
        """Return stored jobs, newest first, filtered as asked."""
        j = schema.jobs
        stmt = select(j).where(j.c.cluster == self.cluster)
        if states:
            stmt = stmt.where(j.c.state.in_(list(states)))
        if user:
            stmt = stmt.where(j.c.user == user)
        if job_ids:
            stmt = stmt.where(j.c.job_id.in_(list(job_ids)))
        if array_job_id is not None:
            stmt = stmt.where(j.c.array_job_id == array_job_id)
        if array_task_id is not None:
            stmt = stmt.where(j.c.array_task_id == array_task_id)
        if not include_gone:
            stmt = stmt.where(j.c.gone.is_(False))
        stmt = stmt.order_by(j.c.job_id.desc(), j.c.id.desc())
        if limit:
            stmt = stmt.limit(limit)
        with self.engine.connect() as conn:
            return [
                StoredJob(
                    row_id=int(r["id"]),
                    job=row_to_job(r),
                    cluster=r["cluster"],
                    first_seen=r["first_seen"],
                    last_seen=r["last_seen"],
                    gone=bool(r["gone"]),
                )
                for r in conn.execute(stmt).mappings()
            ]

    def events(self, job_id: int) -> list[dict[str, Any]]:
        """Return the events of the newest row for ``job_id``, oldest first."""
        j, e = schema.jobs, schema.job_events
        with self.engine.connect() as conn:
            row_id = conn.execute(
                select(func.max(j.c.id)).where(
                    and_(j.c.cluster == self.cluster, j.c.job_id == job_id)
                )
            ).scalar()
            if row_id is None:
                return []
            stmt = select(e).where(e.c.job_row == row_id).order_by(e.c.id)
            return [dict(r) for r in conn.execute(stmt).mappings()]

    def count_jobs(self) -> int:
        with self.engine.connect() as conn:
            return int(conn.execute(select(func.count()).select_from(schema.jobs)).scalar() or 0)

    # -- writes --------------------------------------------------------------

    def apply_cycle(
        self,
        diff: JobDiff,
        row_ids: dict[int, int],
        nodes: Sequence[Node],
        at: datetime,
    ) -> None:
        """Store one observe cycle atomically; fills ``row_ids`` for new jobs.

        ``row_ids`` maps Slurm job ids to our row ids for the jobs the observer tracks; it
        is only updated after the transaction commits, so a failed write changes nothing.
        """
        j, e = schema.jobs, schema.job_events
        new_ids: dict[int, int] = {}
        try:
            with self.engine.begin() as conn:
                if diff.new:
                    reattach = self._reattachable(conn, diff.new)
                    for rid_job in diff.new:
                        rid = reattach.get(rid_job.job_id)
                        if rid is not None:
                            new_ids[rid_job.job_id] = rid
                    if reattach:
                        self._update_rows(
                            conn, [job for job in diff.new if job.job_id in reattach], new_ids, at
                        )
                    fresh = [job for job in diff.new if job.job_id not in reattach]
                    extra = {
                        "cluster": self.cluster,
                        "first_seen": at,
                        "last_seen": at,
                        "updated_at": at,
                        "gone": False,
                    }
                    stmt = insert(j).returning(j.c.id, j.c.job_id, sort_by_parameter_order=True)
                    # Rows are built a chunk at a time: 100k row dicts at once cost ~300 MB.
                    for chunk in _chunks(fresh):
                        rows = _fitted(conn, j, [{**job_to_row(job), **extra} for job in chunk])
                        for rid, job_id in conn.execute(stmt, rows):
                            new_ids[int(job_id)] = int(rid)
                    self._record_submissions(conn, fresh, at)
                ids = {**row_ids, **new_ids}
                if diff.changed:
                    self._update_rows(conn, diff.changed, ids, at)
                ended = [ids[i] for i in (*diff.gone, *diff.vanished) if i in ids]
                if ended:
                    for chunk in _chunks(ended):
                        conn.execute(
                            update(j).where(j.c.id.in_(list(chunk))).values(gone=True, last_seen=at)
                        )
                events = [
                    {
                        "job_row": ids[t.job_id],
                        "at": at,
                        "kind": t.kind,
                        "from_state": t.from_state,
                        "to_state": t.to_state,
                        "restart_count": t.restart_count,
                        "detail": None,
                    }
                    for t in diff.transitions
                    if t.job_id in ids
                ]
                if events:
                    conn.execute(insert(e), _fitted(conn, e, events))
                if nodes:
                    self._upsert_nodes(conn, nodes, at)
        except SQLAlchemyError as exc:
            found = classify(exc, sqlite_file(self.engine))
            cause = found if found is not None else getattr(exc, "orig", None) or exc
            raise StoreError(f"could not store the observe cycle: {cause}") from exc
        row_ids.update(new_ids)
        for job_id in (*diff.gone, *diff.vanished):
            row_ids.pop(job_id, None)

    def _record_submissions(self, conn: Any, jobs: Sequence[Job], at: datetime) -> None:
        """Record the submission of each newly seen job that asks slurmgpu for something
        and has no record yet (store/submission_record.py): one query for the lot."""
        wanted: dict[int, dict[str, Any]] = {}
        for job in jobs:
            row = submission_row(job, self.cluster, at)
            if row is not None:
                wanted.setdefault(int(row["job_id"]), row)
        if not wanted:
            return
        s = schema.submissions
        for chunk in _chunks(list(wanted)):
            stmt = select(s.c.job_id, s.c.submitted_at).where(
                and_(s.c.cluster == self.cluster, s.c.job_id.in_(list(chunk)))
            )
            for job_id, submitted_at in conn.execute(stmt):
                row = wanted.get(int(job_id))
                if row is not None and submitted_at >= row["submitted_at"] - SKEW:
                    del wanted[int(job_id)]  # recorded (an array task before, an old sgpu submit)
        if wanted:
            conn.execute(insert(s), _fitted(conn, s, list(wanted.values())))

    def _reattachable(self, conn: Any, jobs: Sequence[Job]) -> dict[int, int]:
        """Return job id → row id for new jobs that are a row we marked gone too early.

        A job id Slurm reuses (new submit time) gets a new row instead.
        """
        j = schema.jobs
        by_id = {job.job_id: job for job in jobs}
        out: dict[int, int] = {}
        for chunk in _chunks(list(by_id)):
            stmt = (
                select(j.c.id, j.c.job_id, j.c.submit_time)
                .where(and_(j.c.cluster == self.cluster, j.c.job_id.in_(list(chunk))))
                .order_by(j.c.id)
            )
            for rid, job_id, submit_time in conn.execute(stmt):
                job = by_id[int(job_id)]
                if (
                    submit_time is not None
                    and job.submit_time is not None
                    and submit_time == job.submit_time
                ) or (submit_time is None and job.submit_time is None):
                    out[int(job_id)] = int(rid)
                else:
                    out.pop(int(job_id), None)
        return out

    def _update_rows(
        self, conn: Any, jobs: Sequence[Job], ids: Mapping[int, int], at: datetime
    ) -> None:
        if not jobs:
            return
        j = schema.jobs
        extra = {"last_seen": at, "updated_at": at, "gone": False}
        cols = [*job_to_row(jobs[0]), *extra]
        stmt = update(j).where(j.c.id == bindparam("_rid")).values({c: bindparam(c) for c in cols})
        for chunk in _chunks(jobs):
            rows = [{**job_to_row(job), **extra, "_rid": ids[job.job_id]} for job in chunk]
            conn.execute(stmt, _fitted(conn, j, rows))

    def _upsert_nodes(self, conn: Any, nodes: Sequence[Node], at: datetime) -> None:
        n, g = schema.nodes, schema.gpus
        names = [node.name for node in nodes]
        existing: set[str] = set()
        known_gpus: set[tuple[str, int]] = set()
        for chunk in _chunks(names):
            existing.update(
                r[0]
                for r in conn.execute(
                    select(n.c.name).where(
                        and_(n.c.cluster == self.cluster, n.c.name.in_(list(chunk)))
                    )
                )
            )
            known_gpus.update(
                (r[0], int(r[1]))
                for r in conn.execute(
                    select(g.c.node, g.c.index).where(
                        and_(g.c.cluster == self.cluster, g.c.node.in_(list(chunk)))
                    )
                )
            )
        inserts, updates, gpu_rows = [], [], []
        for node in nodes:
            row = node_to_row(node)
            row["last_seen"] = at
            if node.name in existing:
                row["_name"] = node.name
                updates.append(row)
            else:
                row["cluster"] = self.cluster
                inserts.append(row)
            for index in range(node.gpus):
                if (node.name, index) not in known_gpus:
                    gpu_rows.append(
                        {
                            "cluster": self.cluster,
                            "node": node.name,
                            "index": index,
                            "gpu_type": node.gpu_type,
                            "last_seen": at,
                        }
                    )
        if inserts:
            conn.execute(insert(n), _fitted(conn, n, inserts))
        if updates:
            cols = [k for k in updates[0] if k not in {"_name", "name"}]
            stmt = (
                update(n)
                .where(and_(n.c.cluster == self.cluster, n.c.name == bindparam("_name")))
                .values({c: bindparam(c) for c in cols})
            )
            for chunk in _chunks(updates):
                conn.execute(stmt, _fitted(conn, n, list(chunk)))
        if gpu_rows:
            conn.execute(insert(g), _fitted(conn, g, gpu_rows))

    def record_submission(
        self,
        job_id: int,
        *,
        at: datetime,
        uid: int,
        user: str,
        cwd: str,
        argv: Sequence[str],
        malleable: tuple[int, int] | None = None,
        checkpoint_signal: str | None = None,
        checkpoint_grace_s: int | None = None,
        hints: Mapping[str, Any] | None = None,
    ) -> None:
        """Record a submission for ``job_id`` as given (the daemon's own records come from
        the observe cycle: store/submission_record.py)."""
        try:
            with self.engine.begin() as conn:
                row = {
                    "cluster": self.cluster,
                    "job_id": job_id,
                    "submitted_at": at,
                    "uid": uid,
                    "user": user,
                    "cwd": cwd,
                    "argv": list(argv),
                    "malleable_min": malleable[0] if malleable else None,
                    "malleable_max": malleable[1] if malleable else None,
                    "checkpoint_signal": checkpoint_signal,
                    "checkpoint_grace_s": checkpoint_grace_s,
                    "hints": dict(hints) if hints else None,
                }
                s = schema.submissions
                conn.execute(insert(s), _fitted(conn, s, [row]))
        except SQLAlchemyError as exc:
            raise StoreError(f"could not record the submission: {one_line(exc)}") from exc

    def submissions(self, job_id: int) -> list[dict[str, Any]]:
        s = schema.submissions
        stmt = (
            select(s)
            .where(and_(s.c.cluster == self.cluster, s.c.job_id == job_id))
            .order_by(s.c.id)
        )
        with self.engine.connect() as conn:
            return [dict(r) for r in conn.execute(stmt).mappings()]
