"""Usage samples: idempotent batched ingest, per-job aggregates in SQL, end-of-job summaries.

Aggregation happens in the database (works on SQLite and PostgreSQL), never in Python
loops over samples.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Engine, and_, case, func, insert, select
from sqlalchemy.exc import OperationalError, SQLAlchemyError

from slurmgpu.store import schema
from slurmgpu.store.database import StoreError
from slurmgpu.store.schema import as_utc
from slurmgpu.store.summary_columns import summary_columns
from slurmgpu.wire import SampleBatch

# A GPU counts as busy in a sample above this utilisation (NVML reports integers).
IDLE_UTIL_PCT = 0.5


class StoreBusyError(StoreError):
    """The database is locked or unreachable right now; the caller may retry."""


_SAMPLE_COLUMNS = (
    "sample_uid",
    "cluster",
    "node",
    "kind",
    "job_id",
    "gpu_index",
    "at",
    "util_pct",
    "memory_used_mib",
    "memory_total_mib",
    "power_w",
    "temperature_c",
    "processes",
    "shared",
    "source",
    "cpu_pct",
    "cpus_allocated",
    "rss_mib",
    "cgroup_memory_mib",
)


def _epoch(at: float) -> datetime:
    return datetime.fromtimestamp(at, UTC)


_SECOND_TEXT: dict[int, str] = {}


def _sqlite_time(at: float) -> str:
    """The text SQLAlchemy's SQLite DateTime stores (UTC, microseconds), so reads agree.

    Samples of one batch share a few seconds, so the formatted second is cached.
    """
    second = int(at)
    prefix = _SECOND_TEXT.get(second)
    if prefix is None:
        if len(_SECOND_TEXT) > 4096:
            _SECOND_TEXT.clear()
        prefix = _SECOND_TEXT[second] = datetime.fromtimestamp(second, UTC).strftime(
            "%Y-%m-%d %H:%M:%S"
        )
    return f"{prefix}.{round((at - second) * 1e6) % 1_000_000:06d}"


def _total_changes(conn: Any) -> int:
    """SQLite's count of rows changed on this connection (exact even for executemany)."""
    return int(conn.connection.dbapi_connection.total_changes)


class UsageStore:
    """Writes agents' samples and answers per-job usage questions."""

    def __init__(self, engine: Engine, cluster: str = "") -> None:
        self.engine = engine
        self.cluster = cluster

    def ingest(self, batch: SampleBatch) -> tuple[int, int]:
        """Store a batch in one transaction; return (accepted, duplicates ignored).

        Rows go straight to the driver's ``executemany`` as tuples: at 20,000+ samples a
        second the per-row parameter processing of a Core insert is the bottleneck.
        The ON CONFLICT clause makes a resent sample a no-op (idempotent ingest).
        """
        sqlite = self.engine.dialect.name == "sqlite"
        at = _sqlite_time if sqlite else _epoch
        c, node = self.cluster, batch.node
        rows: list[tuple[Any, ...]] = [
            (
                s.sample_uid,
                c,
                node,
                "gpu",
                s.job_id,
                s.gpu_index,
                at(s.at),
                s.util_pct,
                s.memory_used_mib,
                s.memory_total_mib,
                s.power_w,
                s.temperature_c,
                s.processes,
                s.shared,
                s.source,
                None,
                None,
                None,
                None,
            )
            for s in batch.gpu
        ]
        rows.extend(
            (
                h.sample_uid,
                c,
                node,
                "host",
                h.job_id,
                None,
                at(h.at),
                None,
                None,
                None,
                None,
                None,
                None,
                None,
                None,
                h.cpu_pct,
                h.cpus_allocated,
                h.rss_mib,
                h.cgroup_memory_mib,
            )
            for h in batch.host
        )
        if not rows:
            return 0, 0
        mark = "?" if self.engine.dialect.paramstyle == "qmark" else "%s"
        sql = (
            f"INSERT INTO samples ({', '.join(_SAMPLE_COLUMNS)}) "
            f"VALUES ({', '.join([mark] * len(_SAMPLE_COLUMNS))}) "
            "ON CONFLICT (sample_uid) DO NOTHING"
        )
        try:
            with self.engine.begin() as conn:
                before = _total_changes(conn) if sqlite else None
                result = conn.exec_driver_sql(sql, rows)
                accepted = _total_changes(conn) - before if before is not None else result.rowcount
                if accepted is None or accepted < 0:  # driver did not count; ask
                    accepted = self._count_uids(conn, [r[0] for r in rows])
        except OperationalError as exc:
            raise StoreBusyError(f"database busy or unavailable: {exc.orig}") from exc
        except SQLAlchemyError as exc:
            raise StoreError(f"could not store samples: {exc}") from exc
        return accepted, len(rows) - accepted

    def _count_uids(self, conn: Any, uids: Sequence[str]) -> int:
        s = schema.samples
        total = 0
        for i in range(0, len(uids), 500):
            chunk = list(uids[i : i + 500])
            total += int(
                conn.execute(select(func.count()).where(s.c.sample_uid.in_(chunk))).scalar() or 0
            )
        return total

    # -- aggregates ------------------------------------------------------------

    def gpu_usage(self, job_id: int, *, since: datetime | None = None) -> list[GpuUsage]:
        """Return per-GPU aggregates of a job (mean/max util, max memory, trailing idle)."""
        return self.gpu_usage_many([job_id], since=since).get(job_id, [])

    def gpu_usage_many(
        self, job_ids: Sequence[int], *, since: datetime | None = None
    ) -> dict[int, list[GpuUsage]]:
        """Per-GPU aggregates of many jobs in one grouped query per 500 jobs."""
        out: dict[int, list[GpuUsage]] = {}
        ids = list(job_ids)
        for i in range(0, len(ids), 500):
            self._gpu_usage_chunk(ids[i : i + 500], since, out)
        return out

    def _gpu_usage_chunk(
        self, job_ids: list[int], since: datetime | None, out: dict[int, list[GpuUsage]]
    ) -> None:
        s = schema.samples
        busy = case((s.c.util_pct > IDLE_UTIL_PCT, s.c.at), else_=None)
        cond = [s.c.cluster == self.cluster, s.c.job_id.in_(job_ids), s.c.kind == "gpu"]
        if since is not None:
            cond.append(s.c.at >= since)
        stmt = (
            select(
                s.c.job_id,
                s.c.node,
                s.c.gpu_index,
                func.count().label("n"),
                func.avg(s.c.util_pct).label("mean_util"),
                func.max(s.c.util_pct).label("max_util"),
                func.max(s.c.memory_used_mib).label("max_mem"),
                func.max(s.c.memory_total_mib).label("mem_total"),
                func.min(s.c.at).label("first_at"),
                func.max(s.c.at).label("last_at"),
                func.max(busy).label("last_busy_at"),
                func.max(case((s.c.shared.is_(True), 1), else_=0)).label("shared"),
                func.sum(case((s.c.source == "error", 1), else_=0)).label("errors"),
                func.max(s.c.processes).label("max_processes"),
            )
            .where(and_(*cond))
            .group_by(s.c.job_id, s.c.node, s.c.gpu_index)
            .order_by(s.c.job_id, s.c.node, s.c.gpu_index)
        )
        with self.engine.connect() as conn:
            for r in conn.execute(stmt).mappings():
                first, last = as_utc(r["first_at"]), as_utc(r["last_at"])
                # as_utc(None) is the epoch: keep "never busy" as None, not 1970.
                last_busy = None if r["last_busy_at"] is None else as_utc(r["last_busy_at"])
                idle_since = first if last_busy is None else last_busy
                out.setdefault(int(r["job_id"]), []).append(
                    GpuUsage(
                        node=r["node"],
                        gpu_index=int(r["gpu_index"]),
                        samples=int(r["n"]),
                        mean_util_pct=_f(r["mean_util"]),
                        max_util_pct=_f(r["max_util"]),
                        max_memory_mib=_f(r["max_mem"]),
                        memory_total_mib=_f(r["mem_total"]),
                        first_at=first,
                        last_at=last,
                        trailing_idle=max(last - idle_since, timedelta(0)),
                        never_busy=last_busy is None,
                        shared=bool(r["shared"]),
                        error_samples=int(r["errors"] or 0),
                        max_processes=int(r["max_processes"] or 0),
                    )
                )

    def host_usage(self, job_id: int) -> list[HostUsage]:
        """Return per-node CPU and memory aggregates of a job."""
        s = schema.samples
        mem = func.coalesce(s.c.cgroup_memory_mib, s.c.rss_mib)
        stmt = (
            select(
                s.c.node,
                func.count().label("n"),
                func.avg(s.c.cpu_pct).label("mean_cpu"),
                func.max(s.c.cpu_pct).label("max_cpu"),
                func.max(s.c.cpus_allocated).label("cpus"),
                func.max(mem).label("max_mem"),
            )
            .where(and_(s.c.cluster == self.cluster, s.c.job_id == job_id, s.c.kind == "host"))
            .group_by(s.c.node)
            .order_by(s.c.node)
        )
        with self.engine.connect() as conn:
            return [
                HostUsage(
                    node=r["node"],
                    samples=int(r["n"]),
                    mean_cpu_pct=_f(r["mean_cpu"]),
                    max_cpu_pct=_f(r["max_cpu"]),
                    cpus_allocated=int(r["cpus"]) if r["cpus"] is not None else None,
                    max_memory_mib=_f(r["max_mem"]),
                )
                for r in conn.execute(stmt).mappings()
            ]

    def count_samples(self) -> int:
        with self.engine.connect() as conn:
            return int(conn.execute(select(func.count()).select_from(schema.samples)).scalar() or 0)

    def save_summary(self, job_id: int, summary: dict[str, Any], at: datetime) -> None:
        try:
            with self.engine.begin() as conn:
                conn.execute(
                    insert(schema.job_summaries),
                    {
                        "cluster": self.cluster,
                        "job_id": job_id,
                        "created_at": at,
                        "summary": summary,
                        **summary_columns(summary),
                    },
                )
        except SQLAlchemyError as exc:
            raise StoreError(f"could not store the summary of job {job_id}: {exc}") from exc

    def summary(self, job_id: int) -> dict[str, Any] | None:
        j = schema.job_summaries
        stmt = (
            select(j.c.summary)
            .where(and_(j.c.cluster == self.cluster, j.c.job_id == job_id))
            .order_by(j.c.id.desc())
            .limit(1)
        )
        with self.engine.connect() as conn:
            value = conn.execute(stmt).scalar()
        return dict(value) if value is not None else None


def _f(value: Any) -> float | None:
    return None if value is None else float(value)


@dataclass(frozen=True, slots=True)
class GpuUsage:
    """What one job did with one GPU over the samples we have."""

    node: str
    gpu_index: int
    samples: int
    mean_util_pct: float | None
    max_util_pct: float | None
    max_memory_mib: float | None
    memory_total_mib: float | None
    first_at: datetime
    last_at: datetime
    trailing_idle: timedelta  # how long it has been idle up to the last sample
    never_busy: bool
    shared: bool
    error_samples: int
    # Most processes of the job seen on it in one sample; 0: allocated but never used.
    # None when unknown (a usage rebuilt from an end-of-job summary).
    max_processes: int | None = None


@dataclass(frozen=True, slots=True)
class HostUsage:
    """What one job did with the CPUs and memory of one node."""

    node: str
    samples: int
    mean_cpu_pct: float | None
    max_cpu_pct: float | None
    cpus_allocated: int | None
    max_memory_mib: float | None

    @property
    def cpu_efficiency_pct(self) -> float | None:
        if self.mean_cpu_pct is None or not self.cpus_allocated:
            return None
        return self.mean_cpu_pct / self.cpus_allocated
