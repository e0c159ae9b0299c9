"""Usage samples: idempotent batched ingest, per-job aggregates in SQL, end-of-job summaries.

Aggregation happens in the database (works on SQLite and PostgreSQL), never in Python
loops over samples.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Engine, and_, case, func, insert, literal, select
from sqlalchemy.exc import OperationalError, SQLAlchemyError

from slurmgpu.report.report_sql import epoch_s
from slurmgpu.store import schema
from slurmgpu.store.database import StoreError
from slurmgpu.store.schema import as_utc
from slurmgpu.store.summary_columns import energy_columns, summary_columns
from slurmgpu.wire import SampleBatch

# A GPU counts as busy in a sample above this utilisation (NVML reports integers).
IDLE_UTIL_PCT = 0.5
# Two samples of one GPU further apart than this (agent down, job requeued onto the same
# GPU) bound no energy interval: what happened between them is unknown.
ENERGY_MAX_GAP_S = 900.0


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
    "energy_mj",
    "iowait_pct",
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
                s.energy_mj,
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
                None,
                h.iowait_pct,
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

    def gpu_energy(self, job_id: int) -> list[GpuEnergy]:
        """Return the energy each of a job's GPUs used over its samples (see
        :meth:`gpu_energy_many`)."""
        return self.gpu_energy_many([job_id]).get(job_id, [])

    def gpu_energy_many(self, job_ids: Sequence[int]) -> dict[int, list[GpuEnergy]]:
        """Per-GPU energy of many jobs, one windowed query per 500 jobs.

        Between two consecutive samples of one job on one GPU (at most
        ``ENERGY_MAX_GAP_S`` apart) the energy is the NVML counter's delta when both
        samples carry the counter and it did not go back (a driver reload), else the
        trapezoid of the two power readings. An interval whose closing sample shows the
        GPU idle (util <= ``IDLE_UTIL_PCT``: NVML's util covers the window before the
        reading) counts as idle energy. A shared GPU's energy is split evenly between the
        jobs sampled on it at that instant.
        """
        out: dict[int, list[GpuEnergy]] = {}
        ids = list(job_ids)
        for i in range(0, len(ids), 500):
            self._gpu_energy_chunk(ids[i : i + 500], out)
        return out

    def _gpu_energy_chunk(self, job_ids: list[int], out: dict[int, list[GpuEnergy]]) -> None:
        s = schema.samples
        peers = schema.samples.alias("peers")
        sharing = (
            select(func.count())
            .where(
                peers.c.cluster == s.c.cluster,
                peers.c.node == s.c.node,
                peers.c.gpu_index == s.c.gpu_index,
                peers.c.at == s.c.at,
                peers.c.kind == "gpu",
                peers.c.job_id.is_not(None),
            )
            .scalar_subquery()
        )
        part = (s.c.job_id, s.c.node, s.c.gpu_index)
        t = epoch_s(s.c.at)
        inner = (
            select(
                s.c.job_id,
                s.c.node,
                s.c.gpu_index,
                t.label("t"),
                s.c.util_pct,
                s.c.power_w,
                s.c.energy_mj,
                func.lag(t).over(partition_by=part, order_by=s.c.at).label("prev_t"),
                func.lag(s.c.power_w).over(partition_by=part, order_by=s.c.at).label("prev_power"),
                func.lag(s.c.energy_mj)
                .over(partition_by=part, order_by=s.c.at)
                .label("prev_energy"),
                func.first_value(s.c.power_w)
                .over(partition_by=part, order_by=s.c.at)
                .label("first_power"),
                # The whole partition as the frame: the same sort as the other windows
                # (a descending first_value would sort every row a second time).
                func.last_value(s.c.power_w)
                .over(partition_by=part, order_by=s.c.at, rows=(None, None))
                .label("last_power"),
                case((s.c.shared.is_(True), sharing), else_=literal(1)).label("sharers"),
            )
            .where(s.c.cluster == self.cluster, s.c.job_id.in_(job_ids), s.c.kind == "gpu")
            .subquery()
        )
        q = inner.c
        dt = q.t - q.prev_t
        near = and_(q.prev_t.is_not(None), dt <= ENERGY_MAX_GAP_S)
        by_counter = and_(
            near,
            q.energy_mj.is_not(None),
            q.prev_energy.is_not(None),
            q.energy_mj >= q.prev_energy,
        )
        by_power = and_(near, q.power_w.is_not(None), q.prev_power.is_not(None))
        share = 1.0 / func.coalesce(func.nullif(q.sharers, 0), 1)
        joules = case(
            (by_counter, (q.energy_mj - q.prev_energy) / 1000.0 * share),
            (by_power, (q.power_w + q.prev_power) / 2.0 * dt * share),
            else_=None,
        )
        idle = func.coalesce(q.util_pct, 0.0) <= IDLE_UTIL_PCT
        stmt = (
            select(
                q.job_id,
                q.node,
                q.gpu_index,
                func.count().label("n"),
                func.sum(joules).label("joules"),
                func.sum(case((idle, joules), else_=None)).label("idle_joules"),
                func.sum(case((by_counter, 1), else_=0)).label("by_counter"),
                func.sum(case((and_(by_power, ~by_counter), 1), else_=0)).label("by_power"),
                func.sum(case((joules.is_not(None), dt), else_=None)).label("covered_s"),
                func.avg(q.power_w * share).label("mean_power"),
                func.max(q.first_power * share).label("first_power"),
                func.max(q.last_power * share).label("last_power"),
                func.min(q.t).label("first_t"),
                func.max(q.t).label("last_t"),
            )
            .group_by(q.job_id, q.node, q.gpu_index)
            .order_by(q.job_id, q.node, q.gpu_index)
        )
        with self.engine.connect() as conn:
            for r in conn.execute(stmt).mappings():
                out.setdefault(int(r["job_id"]), []).append(
                    GpuEnergy(
                        node=r["node"],
                        gpu_index=int(r["gpu_index"]),
                        samples=int(r["n"]),
                        energy_j=float(r["joules"] or 0.0),
                        idle_energy_j=float(r["idle_joules"] or 0.0),
                        counter_intervals=int(r["by_counter"] or 0),
                        power_intervals=int(r["by_power"] or 0),
                        covered_s=float(r["covered_s"] or 0.0),
                        mean_power_w=_f(r["mean_power"]),
                        first_power_w=_f(r["first_power"]),
                        last_power_w=_f(r["last_power"]),
                        first_at=_epoch(float(r["first_t"])),
                        last_at=_epoch(float(r["last_t"])),
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
                func.avg(s.c.iowait_pct).label("mean_iowait"),
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
                    mean_iowait_pct=_f(r["mean_iowait"]),
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
                        **energy_columns(summary),
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
class GpuEnergy:
    """What one GPU consumed while one job had it, over that job's samples of it.

    ``counter_intervals`` / ``power_intervals``: sample intervals measured by NVML's
    energy counter / estimated from two power readings; ``covered_s``: the time they
    span (less than ``last_at - first_at`` where samples were missing).
    """

    node: str
    gpu_index: int
    samples: int
    energy_j: float
    idle_energy_j: float
    counter_intervals: int
    power_intervals: int
    covered_s: float
    mean_power_w: float | None
    first_at: datetime
    last_at: datetime
    # The power of the first and the last sample (the job's start and end are nearest to
    # them); None when those samples carry no power.
    first_power_w: float | None = None
    last_power_w: float | None = None


@dataclass(frozen=True, slots=True)
class HostUsage:
    """What one job did with the CPUs and memory of one node."""

    node: str
    samples: int
    mean_cpu_pct: float | None
    max_cpu_pct: float | None
    cpus_allocated: int | None
    max_memory_mib: float | None
    # Mean share of time the job's processes waited for block I/O (100 = one process
    # always); None when the node's kernel does not count it.
    mean_iowait_pct: float | None = None

    @property
    def cpu_efficiency_pct(self) -> float | None:
        if self.mean_cpu_pct is None or not self.cpus_allocated:
            return None
        return self.mean_cpu_pct / self.cpus_allocated
