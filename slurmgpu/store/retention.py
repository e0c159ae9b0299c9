"""Retention: raw samples rolled up per job, node, GPU and hour, then deleted.

A sample row costs about 278 bytes with its indexes; at 1,000 GPUs sampled every 10 s
that is 8.64 million rows and 2.4 GB a day, so the samples table must not keep
everything. :func:`roll_up_and_prune` moves every sample of a job older than the cutoff
into ``sample_hours`` (one row per job, node, GPU and UTC hour: counts, sums and maxima,
so the usage readers in :mod:`slurmgpu.store.usage_query` add them to what is still raw and
get the same means and peaks; the energy of each sample interval by the one rule of
:mod:`slurmgpu.store.energy_rule`, and the I/O wait count and sum) and deletes the raw
rows, an hour at a time and at most ``max_samples`` (whole nodes) per transaction, so no
single transaction grows large. Samples of no job (an unallocated GPU) have nothing to
roll up into and are only deleted. Rollups older than their own retention are deleted too.

Sizing (docs/configuration.md#retention, bench/retention.py): the defaults, 6 h of raw
samples and 90 days of hourly rollups, keep a 1,000-GPU site under 2 GB (1.6 GB).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Engine, Select, and_, case, delete, func, insert, literal, select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.sql.elements import ColumnElement

from slurmgpu.store import schema
from slurmgpu.store.database import StoreError
from slurmgpu.store.energy_rule import energy_rows, energy_sums, not_idle_at
from slurmgpu.store.health import one_line, sqlite_file

__all__ = [
    "DEFAULT_ROLLUP_RETENTION",
    "DEFAULT_SAMPLE_RETENTION",
    "PruneResult",
    "Retention",
    "roll_up_and_prune",
]

log = logging.getLogger("slurmgpu.store")

DEFAULT_SAMPLE_RETENTION = timedelta(hours=6)
DEFAULT_ROLLUP_RETENTION = timedelta(days=90)
_BATCH = timedelta(hours=1)  # one hour of samples at a time
# Samples per write transaction: ~0.5 s of SQLite work here (bench/retention.py), well
# inside the 10 s busy timeout other writers wait (store/database.py).
DEFAULT_MAX_SAMPLES = 50_000
_MAX_NODES_PER_CHUNK = 500  # bound parameters of one IN list


@dataclass(frozen=True, slots=True)
class PruneResult:
    rolled_up: int  # raw samples that went into rollups
    deleted: int  # raw samples deleted (rolled up or of no job)
    rollups_deleted: int
    transactions: int = 0  # write transactions that rolled up and deleted samples
    longest_transaction_s: float = 0.0  # what another writer may have waited, at most


def _floor_hour(at: datetime) -> datetime:
    return at.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def _hour_of(engine: Engine, at: ColumnElement[Any]) -> ColumnElement[Any]:
    if engine.dialect.name == "sqlite":
        # SQLite stores "YYYY-MM-DD HH:MM:SS.ffffff" (schema.UtcDateTime): cut at the hour.
        return func.substr(at, 1, 13).concat(literal(":00:00.000000"))
    return func.date_trunc("hour", at)


def roll_up_and_prune(
    engine: Engine,
    cluster: str,
    *,
    now: datetime,
    sample_retention: timedelta = DEFAULT_SAMPLE_RETENTION,
    rollup_retention: timedelta = DEFAULT_ROLLUP_RETENTION,
    max_samples: int = DEFAULT_MAX_SAMPLES,
) -> PruneResult:
    """Roll up and delete samples older than ``now - sample_retention`` (a whole hour).

    Each hour is rolled up in transactions of at most ``max_samples`` samples (about:
    whole nodes are packed, so a job's GPUs and the jobs sharing a GPU are always rolled
    up together, which the energy split of a shared GPU needs), so the daemon's other
    writers (ingest, the observe cycle) wait for one chunk, not for the whole hour.
    """
    s, h = schema.samples, schema.sample_hours
    cutoff = _floor_hour(now - sample_retention)
    rolled = deleted = transactions = 0
    longest = 0.0
    done_to: datetime | None = None
    try:
        while True:
            # The next hour that has samples (hours with none are skipped, not visited).
            with engine.connect() as conn:
                oldest = conn.execute(
                    select(func.min(s.c.at)).where(s.c.cluster == cluster, s.c.at < cutoff)
                ).scalar()
            if oldest is None:
                break
            start = _floor_hour(schema.as_utc(oldest))
            if done_to is not None and start < done_to:
                break  # a sample the window did not catch: never loop on it
            end = done_to = min(start + _BATCH, cutoff)
            window = and_(s.c.cluster == cluster, s.c.at >= start, s.c.at < end)
            counts = _samples_per_node(engine, window)
            for nodes in _node_chunks(counts, max_samples):
                rollup, columns = _rollup(engine, cluster, start, end, nodes)
                part = and_(window, s.c.node.in_(nodes))
                t0 = time.perf_counter()
                with engine.begin() as conn:
                    conn.execute(insert(h).from_select(columns, rollup))
                    n = conn.execute(
                        select(func.count()).where(part, s.c.job_id.is_not(None))
                    ).scalar()
                    rolled += int(n or 0)
                    deleted += int(conn.execute(delete(s).where(part)).rowcount or 0)
                longest = max(longest, time.perf_counter() - t0)
                transactions += 1
        with engine.begin() as conn:
            gone = conn.execute(
                delete(h).where(h.c.cluster == cluster, h.c.hour < now - rollup_retention)
            ).rowcount
    except SQLAlchemyError as exc:  # one line: no statement, no parameters
        raise StoreError(f"samples not pruned: {one_line(exc, sqlite_file(engine))}") from exc
    return PruneResult(rolled, deleted, int(gone or 0), transactions, longest)


def _rollup(
    engine: Engine, cluster: str, start: datetime, end: datetime, nodes: list[str]
) -> tuple[Select[Any], list[str]]:
    """The INSERT ... SELECT source (and its columns) of one hour's rollups on ``nodes``."""
    s = schema.samples
    part = and_(s.c.cluster == cluster, s.c.at >= start, s.c.at < end, s.c.node.in_(nodes))
    hour = _hour_of(engine, s.c.at)
    busy = not_idle_at(s)
    host_mem = func.coalesce(s.c.cgroup_memory_mib, s.c.rss_mib)
    plain = (
        select(
            s.c.cluster,
            s.c.job_id,
            s.c.node,
            s.c.kind,
            s.c.gpu_index,
            hour.label("hour"),
            func.count().label("samples"),
            func.count(s.c.util_pct).label("util_n"),
            func.sum(s.c.util_pct).label("util_sum"),
            func.max(s.c.util_pct).label("util_max"),
            func.max(s.c.memory_used_mib).label("memory_max_mib"),
            func.max(s.c.memory_total_mib).label("memory_total_mib"),
            func.min(s.c.at).label("first_at"),
            func.max(s.c.at).label("last_at"),
            func.max(busy).label("last_busy_at"),
            (func.max(case((s.c.shared.is_(True), 1), else_=0)) > 0).label("shared"),
            func.sum(case((s.c.source == "error", 1), else_=0)).label("errors"),
            func.max(s.c.processes).label("processes_max"),
            func.count(s.c.cpu_pct).label("cpu_n"),
            func.sum(s.c.cpu_pct).label("cpu_sum"),
            func.max(s.c.cpu_pct).label("cpu_max"),
            func.max(s.c.cpus_allocated).label("cpus_max"),
            func.max(host_mem).label("host_memory_max_mib"),
            func.count(s.c.iowait_pct).label("iowait_n"),
            func.sum(s.c.iowait_pct).label("iowait_sum"),
        )
        .where(part, s.c.job_id.is_not(None))
        .group_by(s.c.cluster, s.c.job_id, s.c.node, s.c.kind, s.c.gpu_index, hour)
        .subquery()
    )
    # The hour's energy by the one rule: each GPU sample with what the rule needs
    # of the next one (read up to ENERGY_MAX_GAP_S past the hour, still raw).
    q = energy_rows(
        [
            s.c.cluster == cluster,
            s.c.at >= start,
            s.c.node.in_(nodes),
            s.c.job_id.is_not(None),
            s.c.kind == "gpu",
        ],
        until=end,
    ).c
    energy = (
        select(q.job_id, q.node, q.gpu_index, *energy_sums(q))
        .where(q.inwin == 1)
        .group_by(q.job_id, q.node, q.gpu_index)
        .subquery()
    )  # one hour: no hour column needed to join
    p, e = plain.c, energy.c
    rollup = select(
        p.cluster, p.job_id, p.node, p.kind, func.coalesce(p.gpu_index, -1), p.hour,
        p.samples, p.util_n, p.util_sum, p.util_max, p.memory_max_mib,
        p.memory_total_mib, p.first_at, p.last_at, p.last_busy_at, p.shared, p.errors,
        p.processes_max, p.cpu_n, p.cpu_sum, p.cpu_max, p.cpus_max,
        p.host_memory_max_mib, e.energy_j, e.idle_energy_j, e.counter_intervals,
        e.power_intervals, e.covered_s, e.power_n, e.power_sum, e.first_power_w,
        e.last_power_w, p.iowait_n, p.iowait_sum,
    ).select_from(
        plain.outerjoin(
            energy,
            and_(
                p.kind == "gpu",
                e.job_id == p.job_id,
                e.node == p.node,
                e.gpu_index == p.gpu_index,
            ),
        )
    )  # fmt: skip
    columns = [
        "cluster", "job_id", "node", "kind", "gpu_index", "hour", "samples", "util_n",
        "util_sum", "util_max", "memory_max_mib", "memory_total_mib", "first_at",
        "last_at", "last_busy_at", "shared", "errors", "processes_max", "cpu_n",
        "cpu_sum", "cpu_max", "cpus_max", "host_memory_max_mib", "energy_j",
        "idle_energy_j", "counter_intervals", "power_intervals", "covered_s", "power_n",
        "power_sum", "first_power_w", "last_power_w", "iowait_n", "iowait_sum",
    ]  # fmt: skip
    return rollup, columns


def _samples_per_node(engine: Engine, window: ColumnElement[bool]) -> list[tuple[str, int]]:
    s = schema.samples
    stmt = select(s.c.node, func.count()).where(window).group_by(s.c.node).order_by(s.c.node)
    with engine.connect() as conn:
        return [(str(node), int(n)) for node, n in conn.execute(stmt)]


def _node_chunks(counts: list[tuple[str, int]], max_samples: int) -> list[list[str]]:
    """Nodes packed in order into chunks of at most ``max_samples`` samples (a node with
    more is a chunk of its own) and ``_MAX_NODES_PER_CHUNK`` nodes."""
    chunks: list[list[str]] = []
    size = 0
    for node, n in counts:
        if not chunks or size + n > max_samples or len(chunks[-1]) >= _MAX_NODES_PER_CHUNK:
            chunks.append([])
            size = 0
        chunks[-1].append(node)
        size += n
    return chunks


class Retention:
    """Runs :func:`roll_up_and_prune` from the daemon's cycle, at most once per ``every``."""

    def __init__(
        self,
        engine: Engine,
        cluster: str,
        *,
        sample_retention: timedelta = DEFAULT_SAMPLE_RETENTION,
        rollup_retention: timedelta = DEFAULT_ROLLUP_RETENTION,
        every: timedelta = timedelta(hours=1),
    ) -> None:
        self.engine = engine
        self.cluster = cluster
        self.sample_retention = sample_retention
        self.rollup_retention = rollup_retention
        self.every = every
        self.last_run: datetime | None = None
        self.deleted_total = 0

    def maybe_run(self, now: datetime) -> PruneResult | None:
        """Prune if ``every`` has passed since the last run; never raises for the store."""
        if self.last_run is not None and now - self.last_run < self.every:
            return None
        self.last_run = now
        try:
            result = roll_up_and_prune(
                self.engine,
                self.cluster,
                now=now,
                sample_retention=self.sample_retention,
                rollup_retention=self.rollup_retention,
            )
        except StoreError as exc:
            log.warning("%s; retried in %s", exc, self.every)
            return None
        self.deleted_total += result.deleted
        if result.deleted or result.rollups_deleted:
            log.info(
                "retention: %d sample(s) older than %s deleted (%d rolled up per hour), "
                "%d hourly rollup(s) older than %s deleted",
                result.deleted,
                self.sample_retention,
                result.rolled_up,
                result.rollups_deleted,
                self.rollup_retention,
            )
        return result
