"""Samples of jobs the daemon has not seen yet: held out of every reader, checked later.

A node could post samples for a job id Slurm has not given out yet (the next one), and
those samples, stored unchecked, were counted for that job when it then ran on another
node (issue 36, item 5). Such samples now go to ``held_samples``, which no report,
summary, rollup, policy or metric reads. After each observe cycle :meth:`SampleHold.release`
takes the held samples of every job the daemon has stored and checks each against the
job's runs (store/sample_check.py: the posting node, the job's GPUs there, its start to
end): a sample that fits moves to ``samples`` (so ``sgpu eff``, summaries and policies see
it from then on), one that does not is dropped and counted (``unverified_job``).

The hold is bounded: at most ``max_per_node`` samples of one node (the rest of a batch
is dropped and counted, ``hold_full``), and a sample whose job has not run anywhere
``ttl`` after it arrived (the daemon's ``sample_retention``) is dropped and counted
(``hold_expired``). A job that ended without running (cancelled while pending) drops its
held samples at once. One log line per node and kind of drop, not one per sample.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from sqlalchemy import Engine, Insert, Table, delete, func, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import SQLAlchemyError

from slurmgpu.store import schema
from slurmgpu.store.database import StoreError
from slurmgpu.store.health import one_line
from slurmgpu.store.sample_check import JobRun, misfit

__all__ = [
    "HOLD_MAX_PER_NODE",
    "HOLD_TTL",
    "HeldRuns",
    "ReleaseResult",
    "SampleHold",
]

log = logging.getLogger("slurmgpu.store")

# 20,000 samples of one node (about 6 MB): six hours of an 8-GPU node whose every job
# is unknown to the daemon, sampled every 10 s. Past it a node's held samples are dropped.
HOLD_MAX_PER_NODE = 20_000
HOLD_TTL = timedelta(hours=6)  # the daemon passes its daemon.sample_retention

# Counter keys of :attr:`SampleHold.dropped` (the ``reason`` label of the metric).
UNVERIFIED_JOB = "unverified_job"
HOLD_EXPIRED = "hold_expired"
HOLD_FULL = "hold_full"

_CHUNK = 500
# The columns a held sample carries to ``samples`` (all but the two tables' own ids and
# the hold's arrival time).
_MOVED = tuple(c.name for c in schema.samples.columns if c.name != "id")


class HeldRuns(Protocol):
    """Where and when jobs ran (daemon.placement.SnapshotPlacement.job_runs)."""

    def job_runs(self, job_id: int) -> tuple[JobRun, ...] | None: ...


@dataclass(frozen=True, slots=True)
class ReleaseResult:
    """What one :meth:`SampleHold.release` did."""

    kept: int = 0  # moved to ``samples``
    dropped: int = 0  # did not fit their job's run, or expired
    jobs: frozenset[int] = frozenset()  # jobs that got samples from the hold


def _insert_ignoring(dialect: str, table: Table) -> Insert:
    """``INSERT … ON CONFLICT (sample_uid) DO NOTHING`` in the store's dialect."""
    if dialect == "postgresql":
        return postgresql.insert(table).on_conflict_do_nothing(index_elements=["sample_uid"])
    return sqlite.insert(table).on_conflict_do_nothing(index_elements=["sample_uid"])


def _utc(value: Any) -> float:
    return schema.as_utc(value).timestamp()


class SampleHold:
    """The held samples of one cluster: :meth:`add` at ingest, :meth:`release` per cycle."""

    def __init__(
        self,
        engine: Engine,
        cluster: str = "",
        *,
        ttl: timedelta = HOLD_TTL,
        max_per_node: int = HOLD_MAX_PER_NODE,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.engine = engine
        self.cluster = cluster
        self.ttl = ttl
        self.max_per_node = max_per_node
        self.clock = clock
        # By reason; every reason present from the start, so rate() works at once.
        self.dropped: Counter[str] = Counter(
            dict.fromkeys((UNVERIFIED_JOB, HOLD_EXPIRED, HOLD_FULL), 0)
        )
        self.held_now = 0  # samples held after the last release
        self._told: set[tuple[str, str]] = set()
        self._lock = threading.Lock()

    def _tell_once(self, node: str, what: str, message: str, *args: object) -> None:
        with self._lock:
            first = (node, what) not in self._told
            self._told.add((node, what))
        log.log(logging.WARNING if first else logging.DEBUG, message, *args)

    def _count(self, reason: str, n: int) -> None:
        if n:
            with self._lock:
                self.dropped[reason] += n

    # -- at ingest ---------------------------------------------------------------

    def add(self, conn: Any, node: str, rows: Sequence[dict[str, Any]]) -> tuple[int, int, int]:
        """Hold ``rows`` (``samples`` columns, ``at`` a datetime) in the ingest's transaction.

        Returns (newly held, duplicates, dropped because the node's hold is full).
        """
        if not rows:
            return 0, 0, 0
        h = schema.held_samples
        mine = (h.c.cluster == self.cluster, h.c.node == node)
        before = int(conn.execute(select(func.count()).where(*mine)).scalar() or 0)
        room = max(self.max_per_node - before, 0)
        taken, full = list(rows[:room]), len(rows) - min(room, len(rows))
        if taken:
            held_at = datetime.fromtimestamp(float(self.clock()), UTC)
            conn.execute(
                _insert_ignoring(self.engine.dialect.name, h),
                [{**row, "cluster": self.cluster, "held_at": held_at} for row in taken],
            )
        after = int(conn.execute(select(func.count()).where(*mine)).scalar() or 0)
        if full:
            self._count(HOLD_FULL, full)
            self._tell_once(
                node,
                HOLD_FULL,
                "node %s: %d sample(s) of jobs the daemon has not seen dropped: the node "
                "already has %d held (samples for job ids not given out yet?)",
                node,
                full,
                before,
            )
        return after - before, len(taken) - (after - before), full

    # -- after each observe cycle ------------------------------------------------

    def release(self, runs: HeldRuns, now: float | None = None) -> ReleaseResult:
        """Expire old held samples, then check those of every job the store knows.

        Raises StoreError when the store cannot be read or written (nothing half done:
        each job's samples move in one transaction).
        """
        moment = float(self.clock() if now is None else now)
        try:
            dropped = self._expire(moment)
            kept, jobs = 0, set()
            for job_id in self._stored_jobs():
                job_runs = runs.job_runs(job_id)
                if job_runs is None:
                    continue  # not run anywhere yet: keep holding
                moved, lost = self._settle(job_id, job_runs)
                kept += moved
                dropped += lost
                if moved:
                    jobs.add(job_id)
            h = schema.held_samples
            with self.engine.connect() as conn:
                self.held_now = int(
                    conn.execute(select(func.count()).where(h.c.cluster == self.cluster)).scalar()
                    or 0
                )
        except SQLAlchemyError as exc:
            raise StoreError(f"could not check held samples: {one_line(exc)}") from exc
        return ReleaseResult(kept=kept, dropped=dropped, jobs=frozenset(jobs))

    def _expire(self, now: float) -> int:
        h = schema.held_samples
        cutoff = datetime.fromtimestamp(now, UTC) - self.ttl
        old = (h.c.cluster == self.cluster, h.c.held_at < cutoff)
        with self.engine.begin() as conn:
            per_node = conn.execute(
                select(h.c.node, func.count(), func.min(h.c.job_id), func.max(h.c.job_id))
                .where(*old)
                .group_by(h.c.node)
            ).all()
            if not per_node:
                return 0
            conn.execute(delete(h).where(*old))
        total = 0
        for node, n, low, high in per_node:
            total += int(n)
            self._tell_once(
                str(node),
                HOLD_EXPIRED,
                "node %s: %d held sample(s) dropped: their job(s) (ids %s to %s) did not run "
                "within %s of their arrival",
                node,
                n,
                low,
                high,
                self.ttl,
            )
        self._count(HOLD_EXPIRED, total)
        return total

    def _stored_jobs(self) -> list[int]:
        """Job ids with held samples that the store has a row of (any other is unknown)."""
        h, j = schema.held_samples, schema.jobs
        stmt = (
            select(h.c.job_id)
            .where(
                h.c.cluster == self.cluster,
                select(j.c.id).where(j.c.cluster == h.c.cluster, j.c.job_id == h.c.job_id).exists(),
            )
            .distinct()
        )
        with self.engine.connect() as conn:
            return [int(jid) for (jid,) in conn.execute(stmt)]

    def _settle(self, job_id: int, job_runs: tuple[JobRun, ...]) -> tuple[int, int]:
        """Move the job's held samples that fit its runs to ``samples``, drop the rest."""
        h, s = schema.held_samples, schema.samples
        keep: list[int] = []
        misfits: dict[str, Counter[str]] = {}
        with self.engine.begin() as conn:
            rows = conn.execute(
                select(h.c.id, h.c.node, h.c.kind, h.c.gpu_index, h.c.at).where(
                    h.c.cluster == self.cluster, h.c.job_id == job_id
                )
            ).all()
            for row_id, node, kind, gpu_index, at in rows:
                index = int(gpu_index) if kind == "gpu" and gpu_index is not None else None
                reason = misfit(job_runs, str(node), index, _utc(at))
                if reason:
                    misfits.setdefault(str(node), Counter())[reason] += 1
                else:
                    keep.append(int(row_id))
            insert = _insert_ignoring(self.engine.dialect.name, s)
            for i in range(0, len(keep), _CHUNK):
                chunk = keep[i : i + _CHUNK]
                moved = select(*(h.c[name] for name in _MOVED)).where(h.c.id.in_(chunk))
                conn.execute(insert.from_select(list(_MOVED), moved))
            ids = [int(r[0]) for r in rows]
            for i in range(0, len(ids), _CHUNK):
                conn.execute(delete(h).where(h.c.id.in_(ids[i : i + _CHUNK])))
        lost = len(rows) - len(keep)
        self._count(UNVERIFIED_JOB, lost)
        for node, reasons in misfits.items():
            where = "; ".join(f"{n} {why}" for why, n in sorted(reasons.items()))
            self._tell_once(
                node,
                UNVERIFIED_JOB,
                "node %s: %d held sample(s) of job %d dropped once Slurm listed it (%s)",
                node,
                sum(reasons.values()),
                job_id,
                where,
            )
        return len(keep), lost
