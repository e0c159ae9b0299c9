"""Usage samples: idempotent batched ingest, per-job aggregates in SQL, end-of-job summaries.

Aggregation happens in the database (works on SQLite and PostgreSQL), never in Python
loops over samples.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from sqlalchemy import Engine, and_, case, func, insert, select
from sqlalchemy.exc import OperationalError, SQLAlchemyError

from slurmgpu.store import schema
from slurmgpu.store.database import StoreError
from slurmgpu.store.energy_rule import IDLE_UTIL_PCT, energy_rows, energy_sums
from slurmgpu.store.health import Cause, Diagnosis, StoreHealth, classify, one_line, sqlite_file
from slurmgpu.store.sample_check import NOT_ON_NODE, JobRun, misfit
from slurmgpu.store.sample_hold import SampleHold
from slurmgpu.store.schema import as_utc
from slurmgpu.store.summary_columns import energy_columns, summary_columns
from slurmgpu.wire import GpuSampleIn, HostSampleIn, SampleBatch

log = logging.getLogger("slurmgpu.store")


class StoreBusyError(StoreError):
    """The database is locked or unreachable right now; the caller may retry."""


class Placement(Protocol):
    """Where and when jobs ran and how many GPUs nodes have
    (daemon.placement.SnapshotPlacement)."""

    def job_runs(self, job_id: int) -> tuple[JobRun, ...] | None: ...

    def node_gpus(self, node: str) -> int | None: ...


# A sample more than this far from the daemon's clock comes from a node whose clock is
# off. Behind (a spool emptied after an outage, or a slow clock): stored, counted and
# reported. Ahead: refused, counted and reported; no sample can come from the future, and
# one stamped years ahead would stay the newest of its GPU (issue 36: 2096).
SKEW_LIMIT_S = 300.0
FUTURE = "stamped in the future"
_UID_PREFIX_CHARS = 40


def node_scoped_uid(node: str, uid: str) -> str:
    """Return the stored idempotency key of ``uid`` sent by ``node``: unique per node.

    Agents make ids that start with their node's name (``gpu1:run:seq:gpu:job``), kept
    as they are; any other id is namespaced by the node (hashed to stay within 128
    characters), so one node can never take the id of another node's sample and have
    that sample dropped as a duplicate.

    >>> node_scoped_uid("gpu1", "gpu1:r:7:0:42")
    'gpu1:r:7:0:42'
    >>> node_scoped_uid("gpu2", "gpu1:r:7:0:42")[:5]
    'gpu2:'
    """
    if uid.startswith(node + ":"):
        return uid
    digest = hashlib.sha256(f"{node}\0{uid}".encode()).hexdigest()
    return f"{node[:_UID_PREFIX_CHARS]}:{digest}"


# Each kind of sample binds only the columns it fills: the others default to NULL, and
# binding six explicit NULLs per row costs SQLite's executemany about a quarter of its rate.
_GPU_COLUMNS = (
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
    "energy_mj",
)
_HOST_COLUMNS = (
    "sample_uid",
    "cluster",
    "node",
    "kind",
    "job_id",
    "at",
    "cpu_pct",
    "cpus_allocated",
    "rss_mib",
    "cgroup_memory_mib",
    "iowait_pct",
)


def _insert_sql(mark: str) -> tuple[str, str]:
    """The idempotent INSERTs of GPU and host samples with the driver's ``mark``."""
    gpu = (
        f"INSERT INTO samples ({', '.join(_GPU_COLUMNS)}) "
        f"VALUES ({', '.join([mark] * len(_GPU_COLUMNS))}) "
        "ON CONFLICT (sample_uid) DO NOTHING"
    )
    host = (
        f"INSERT INTO samples ({', '.join(_HOST_COLUMNS)}) "
        f"VALUES ({', '.join([mark] * len(_HOST_COLUMNS))}) "
        "ON CONFLICT (sample_uid) DO NOTHING"
    )
    return gpu, host


def _epoch(at: float) -> datetime:
    return datetime.fromtimestamp(at, UTC)


_SECOND_TEXT: dict[int, str] = {}


def _sqlite_time(at: float) -> str:
    """The text SQLAlchemy's SQLite DateTime stores (UTC, microseconds), so reads agree.

    Samples of one batch share a few seconds, so the formatted second is cached.
    """
    second = int(at)
    micro = round((at - second) * 1e6)
    if micro >= 1_000_000:  # rounds up into the next second, as datetime.fromtimestamp does
        second, micro = second + 1, micro - 1_000_000
    prefix = _SECOND_TEXT.get(second)
    if prefix is None:
        if len(_SECOND_TEXT) > 4096:
            _SECOND_TEXT.clear()
        prefix = _SECOND_TEXT[second] = datetime.fromtimestamp(second, UTC).strftime(
            "%Y-%m-%d %H:%M:%S"
        )
    return f"{prefix}.{micro:06d}"


def _held_rows(
    cluster: str, node: str, gpu: list[GpuSampleIn], host: list[HostSampleIn]
) -> list[dict[str, Any]]:
    """The ``samples`` columns of samples to hold (Core rows: a rare path, not the hot one)."""
    rows: list[dict[str, Any]] = []
    for s in gpu:
        rows.append(
            {
                "sample_uid": node_scoped_uid(node, s.sample_uid),
                "cluster": cluster,
                "node": node,
                "kind": "gpu",
                "job_id": s.job_id,
                "gpu_index": s.gpu_index,
                "at": _epoch(s.at),
                "util_pct": s.util_pct,
                "memory_used_mib": s.memory_used_mib,
                "memory_total_mib": s.memory_total_mib,
                "power_w": s.power_w,
                "temperature_c": s.temperature_c,
                "processes": s.processes,
                "shared": s.shared,
                "source": s.source,
                "energy_mj": s.energy_mj,
                "cpu_pct": None,
                "cpus_allocated": None,
                "rss_mib": None,
                "cgroup_memory_mib": None,
                "iowait_pct": None,
            }
        )
    for h in host:
        rows.append(
            {
                "sample_uid": node_scoped_uid(node, h.sample_uid),
                "cluster": cluster,
                "node": node,
                "kind": "host",
                "job_id": h.job_id,
                "gpu_index": None,
                "at": _epoch(h.at),
                "util_pct": None,
                "memory_used_mib": None,
                "memory_total_mib": None,
                "power_w": None,
                "temperature_c": None,
                "processes": None,
                "shared": None,
                "source": None,
                "energy_mj": None,
                "cpu_pct": h.cpu_pct,
                "cpus_allocated": h.cpus_allocated,
                "rss_mib": h.rss_mib,
                "cgroup_memory_mib": h.cgroup_memory_mib,
                "iowait_pct": h.iowait_pct,
            }
        )
    return rows


def _total_changes(conn: Any) -> int:
    """SQLite's count of rows changed on this connection (exact even for executemany)."""
    return int(conn.connection.dbapi_connection.total_changes)


@dataclass(frozen=True, slots=True)
class IngestOutcome:
    """What became of one batch's samples."""

    accepted: int  # newly stored or held (the agent need not send them again)
    duplicates: int  # stored or held before
    held: int = 0  # of ``accepted``: held until their job is listed (store/sample_hold.py)
    refused: int = 0  # left out for good: wrong node, GPU or time, the future, hold full


class UsageStore:
    """Writes agents' samples and answers per-job usage questions."""

    def __init__(
        self,
        engine: Engine,
        cluster: str = "",
        *,
        placement: Placement | None = None,
        clock: Any = time.time,
    ) -> None:
        self.engine = engine
        self.cluster = cluster
        # Set by the daemon: samples are then checked against where and when jobs ran,
        # and those of jobs it has not seen are held until they are listed.
        self.placement = placement
        self.clock = clock
        self.hold = SampleHold(engine, cluster, clock=clock)
        # Samples left out, by reason ("job not on node", "no such GPU", "GPU not
        # allocated to job", "outside the job's run", "stamped in the future"); samples
        # from a node whose clock is off by more than SKEW_LIMIT_S, by node; samples of
        # jobs the daemon did not know yet (held), by node.
        self.refused: Counter[str] = Counter()
        self.unverified: Counter[str] = Counter()
        self.skewed: Counter[str] = Counter()
        self.spool_dropped: Counter[str] = Counter()
        self._told: set[tuple[str, str]] = set()
        # Nodes whose agents are dropping samples now: their count when it started.
        self._dropping: dict[str, int] = {}
        self._lock = threading.Lock()
        # Set by the daemon: each stored batch tells /healthz that writes succeed.
        self.health: StoreHealth | None = None

    def _tell_once(self, node: str, what: str, message: str, *args: object) -> None:
        key = (node, what)
        with self._lock:
            first = key not in self._told
            self._told.add(key)
        log.log(logging.WARNING if first else logging.DEBUG, message, *args)

    def _checked(
        self, node: str, gpu: list[GpuSampleIn], host: list[HostSampleIn]
    ) -> tuple[list[GpuSampleIn], list[HostSampleIn], list[GpuSampleIn], list[HostSampleIn]]:
        """Split a batch's samples: (GPU, host) samples to store, (GPU, host) to hold.

        Kept: samples that fit where and when their job ran (store/sample_check.py) on a
        GPU the node has. Held: those of a job not known to have run anywhere yet. The
        rest are refused and counted by reason.
        """
        placement = self.placement
        if placement is None:
            return gpu, host, [], []
        runs: dict[int, tuple[JobRun, ...] | None] = {}
        for job_id in {s.job_id for s in gpu if s.job_id is not None} | {h.job_id for h in host}:
            runs[job_id] = placement.job_runs(job_id)
        unknown = sorted(j for j, r in runs.items() if r is None)
        gpus = placement.node_gpus(node)
        refused: Counter[str] = Counter()
        jobs_by_reason: dict[str, set[int]] = {}

        def why(job_id: int | None, gpu_index: int | None, at: float) -> str | None:
            """'' to store, None to hold, else the reason it is refused."""
            if gpu_index is not None and gpus is not None and not 0 <= gpu_index < gpus:
                return "no such GPU"
            if job_id is None:
                return ""
            job_runs = runs[job_id]
            if job_runs is None:
                return None
            reason = misfit(job_runs, node, gpu_index, at) if job_runs else NOT_ON_NODE
            if reason:
                jobs_by_reason.setdefault(reason, set()).add(job_id)
            return reason

        kept_gpu, held_gpu = [], []
        for s in gpu:
            reason = why(s.job_id, s.gpu_index, s.at)
            if reason is None:
                held_gpu.append(s)
            elif reason:
                refused[reason] += 1
            else:
                kept_gpu.append(s)
        kept_host, held_host = [], []
        for h in host:
            reason = why(h.job_id, None, h.at)
            if reason is None:
                held_host.append(h)
            elif reason:
                refused[reason] += 1
            else:
                kept_host.append(h)
        if held_gpu or held_host:
            with self._lock:
                self.unverified[node] += len(held_gpu) + len(held_host)
            self._tell_once(
                node,
                "unverified",
                "node %s: sample(s) for job(s) %s the daemon has not seen (yet) held until "
                "Slurm lists them",
                node,
                unknown[:5],
            )
        if refused:
            self._refuse(node, refused, jobs_by_reason)
        return kept_gpu, kept_host, held_gpu, held_host

    def _refuse(
        self, node: str, refused: Counter[str], jobs: dict[str, set[int]] | None = None
    ) -> None:
        with self._lock:
            self.refused.update(refused)
        for reason, n in refused.items():
            self._tell_once(
                node,
                reason,
                "node %s: %d sample(s) refused: %s (jobs %s)",
                node,
                n,
                reason,
                sorted((jobs or {}).get(reason, ()))[:5] or "-",
            )

    def _note_spool(self, batch: SampleBatch) -> None:
        """Count a node's spool drops (cumulative in every batch) and say when they start.

        One WARNING when a node's count first rises, DEBUG while it keeps rising, one
        INFO when it stops (:meth:`_note_spool_stored`). A long outage fills an agent's
        spool: every batch sent after that carries a higher count, while the store
        refuses them (each retry) and when it takes them again (each of the up to
        28,700 spooled batches): a line each refilled the disk that had just been freed.
        """
        if not batch.dropped:
            return
        with self._lock:
            before = self.spool_dropped.get(batch.node, 0)
            self.spool_dropped[batch.node] = max(before, int(batch.dropped))
            if batch.dropped <= before:
                return
            first = batch.node not in self._dropping
            if first:
                self._dropping[batch.node] = before
        log.log(
            logging.WARNING if first else logging.DEBUG,
            "node %s: its agent has dropped %d sample(s) so far (%+d): offline too long "
            "or its spool is full",
            batch.node,
            batch.dropped,
            batch.dropped - before,
        )

    def _note_spool_stored(self, batch: SampleBatch, before: int) -> None:
        """After ``batch`` was stored: a fresh batch (a sample within SKEW_LIMIT_S of now,
        not one from the spool) whose count did not rise past ``before`` (the node's count
        when it arrived) ends the node's drops."""
        if batch.node not in self._dropping or batch.dropped > before:
            return
        now = float(self.clock())
        times = [s.at for s in batch.gpu] + [h.at for h in batch.host]
        if not any(abs(t - now) <= SKEW_LIMIT_S for t in times):
            return
        with self._lock:
            start = self._dropping.get(batch.node)
            total = self.spool_dropped.get(batch.node, 0)
            if start is None or batch.dropped < total:
                return
            del self._dropping[batch.node]
        log.info(
            "node %s: its agent stopped dropping samples (%d so far, %+d in this outage)",
            batch.node,
            total,
            total - start,
        )

    def _screen_clock(self, batch: SampleBatch) -> tuple[list[GpuSampleIn], list[HostSampleIn]]:
        """The batch's samples minus those stamped over SKEW_LIMIT_S ahead of the daemon's
        clock (refused); count samples that far off either way, by node (``skewed``)."""
        now = float(self.clock())
        self._note_spool(batch)
        gpu, host = list(batch.gpu), list(batch.host)
        times = [s.at for s in gpu] + [h.at for h in host]
        if not times or (max(times) - now <= SKEW_LIMIT_S and now - min(times) <= SKEW_LIMIT_S):
            return gpu, host
        off = [t - now for t in times if abs(t - now) > SKEW_LIMIT_S]
        with self._lock:
            self.skewed[batch.node] += len(off)
        limit = now + SKEW_LIMIT_S
        ahead = [t - now for t in times if t > limit]
        if not ahead:
            # Samples arrive late legitimately (a spool emptied after an outage): only a
            # sample from the future says the node's clock is wrong.
            return gpu, host
        self._tell_once(
            batch.node,
            "skew",
            "node %s: %d sample(s) stamped up to %+.0fs ahead of the daemon's clock refused "
            "(check the node's NTP)",
            batch.node,
            len(ahead),
            max(ahead),
        )
        with self._lock:
            self.refused[FUTURE] += len(ahead)
        return [s for s in gpu if s.at <= limit], [h for h in host if h.at <= limit]

    def ingest(self, batch: SampleBatch) -> tuple[int, int]:
        """Store a batch in one transaction; return (accepted, duplicates ignored)."""
        outcome = self.ingest_batch(batch)
        return outcome.accepted, outcome.duplicates

    def ingest_batch(self, batch: SampleBatch) -> IngestOutcome:
        """Store a batch in one transaction; say what became of its samples.

        Rows go straight to the driver's ``executemany`` as tuples: at 20,000+ samples a
        second the per-row parameter processing of a Core insert is the bottleneck.
        The ON CONFLICT clause makes a resent sample a no-op (idempotent ingest); ids are
        unique per node (:func:`node_scoped_uid`). Samples stamped over SKEW_LIMIT_S ahead
        of the daemon's clock are refused (``refused``), those as far behind stored and
        counted (``skewed``). With a ``placement``, samples that do not fit where and when
        their job ran, or whose GPU the node lacks, are left out and counted (``refused``);
        those of a job not known to have run anywhere (yet) are held (``unverified``).
        """
        sqlite = self.engine.dialect.name == "sqlite"
        at = _sqlite_time if sqlite else _epoch
        c, node = self.cluster, batch.node
        sent = len(batch.gpu) + len(batch.host)
        dropped_before = self.spool_dropped.get(node, 0)
        gpu_in, host_in = self._screen_clock(batch)
        gpu_samples, host_samples, held_gpu, held_host = self._checked(node, gpu_in, host_in)
        gpu_rows = [
            (
                node_scoped_uid(node, s.sample_uid),
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
                s.energy_mj,
            )
            for s in gpu_samples
        ]
        host_rows = [
            (
                node_scoped_uid(node, h.sample_uid),
                c,
                node,
                "host",
                h.job_id,
                at(h.at),
                h.cpu_pct,
                h.cpus_allocated,
                h.rss_mib,
                h.cgroup_memory_mib,
                h.iowait_pct,
            )
            for h in host_samples
        ]
        total = len(gpu_rows) + len(host_rows)
        to_hold = len(held_gpu) + len(held_host)
        if not total and not to_hold:
            return IngestOutcome(0, 0, refused=sent)
        gpu_sql, host_sql = _insert_sql("?" if self.engine.dialect.paramstyle == "qmark" else "%s")
        held = held_dupes = full = 0
        try:
            with self.engine.begin() as conn:
                before = _total_changes(conn) if sqlite else None
                counted: int | None = 0
                for sql, rows in ((gpu_sql, gpu_rows), (host_sql, host_rows)):
                    if rows:
                        n = conn.exec_driver_sql(sql, rows).rowcount
                        counted = None if counted is None or n is None or n < 0 else counted + n
                if before is not None:
                    accepted = _total_changes(conn) - before
                elif counted is not None:
                    accepted = counted
                else:  # driver did not count; ask
                    uids = [r[0] for r in gpu_rows] + [r[0] for r in host_rows]
                    accepted = self._count_uids(conn, uids)
                if to_hold:
                    held, held_dupes, full = self.hold.add(
                        conn, node, _held_rows(c, node, held_gpu, held_host)
                    )
        except SQLAlchemyError as exc:
            # One line naming the cause: the driver's message carries the statement and
            # every row's parameters (a batch's worth of text, different each time).
            found = classify(exc, sqlite_file(self.engine)) or Diagnosis(
                Cause.ERROR, type(exc).__name__
            )
            error = StoreBusyError if isinstance(exc, OperationalError) else StoreError
            raise error(f"could not store samples: {found}") from exc
        if self.health is not None:
            self.health.wrote()
        self._note_spool_stored(batch, dropped_before)
        return IngestOutcome(
            accepted=accepted + held,
            duplicates=total - accepted + held_dupes,
            held=held,
            refused=sent - total - to_hold + full,
        )

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
        s, h = schema.samples, schema.sample_hours
        busy = case((s.c.util_pct > IDLE_UTIL_PCT, s.c.at), else_=None)
        cond = [s.c.cluster == self.cluster, s.c.job_id.in_(job_ids), s.c.kind == "gpu"]
        if since is not None:
            cond.append(s.c.at >= since)
        raw = (
            select(
                s.c.job_id,
                s.c.node,
                s.c.gpu_index,
                func.count().label("n"),
                func.count(s.c.util_pct).label("util_n"),
                func.sum(s.c.util_pct).label("util_sum"),
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
        )
        # Hours whose raw samples the retention rolled up (store/retention.py).
        hcond = [h.c.cluster == self.cluster, h.c.job_id.in_(job_ids), h.c.kind == "gpu"]
        if since is not None:
            hcond.append(h.c.last_at >= since)
        rolled = (
            select(
                h.c.job_id,
                h.c.node,
                h.c.gpu_index,
                func.sum(h.c.samples).label("n"),
                func.sum(h.c.util_n).label("util_n"),
                func.sum(h.c.util_sum).label("util_sum"),
                func.max(h.c.util_max).label("max_util"),
                func.max(h.c.memory_max_mib).label("max_mem"),
                func.max(h.c.memory_total_mib).label("mem_total"),
                func.min(h.c.first_at).label("first_at"),
                func.max(h.c.last_at).label("last_at"),
                func.max(h.c.last_busy_at).label("last_busy_at"),
                func.max(case((h.c.shared.is_(True), 1), else_=0)).label("shared"),
                func.sum(h.c.errors).label("errors"),
                func.max(h.c.processes_max).label("max_processes"),
            )
            .where(and_(*hcond))
            .group_by(h.c.job_id, h.c.node, h.c.gpu_index)
        )
        merged: dict[tuple[int, str, int], dict[str, Any]] = {}
        with self.engine.connect() as conn:
            for stmt in (rolled, raw):
                for r in conn.execute(stmt).mappings():
                    key = (int(r["job_id"]), str(r["node"]), int(r["gpu_index"]))
                    row = dict(r)
                    for col in ("first_at", "last_at", "last_busy_at"):
                        row[col] = None if row[col] is None else as_utc(row[col])
                    merged[key] = _merge(merged[key], row) if key in merged else row
        for key in sorted(merged):
            g = merged[key]
            first, last = g["first_at"], g["last_at"]
            last_busy = g["last_busy_at"]
            idle_since = first if last_busy is None else last_busy
            util_n = int(g["util_n"] or 0)
            out.setdefault(key[0], []).append(
                GpuUsage(
                    node=key[1],
                    gpu_index=key[2],
                    samples=int(g["n"]),
                    mean_util_pct=float(g["util_sum"]) / util_n if util_n else None,
                    max_util_pct=_f(g["max_util"]),
                    max_memory_mib=_f(g["max_mem"]),
                    memory_total_mib=_f(g["mem_total"]),
                    first_at=first,
                    last_at=last,
                    trailing_idle=max(last - idle_since, timedelta(0)),
                    never_busy=last_busy is None,
                    shared=bool(g["shared"]),
                    error_samples=int(g["errors"] or 0),
                    max_processes=int(g["max_processes"] or 0),
                )
            )

    def gpu_energy(self, job_id: int) -> list[GpuEnergy]:
        """Return the energy each of a job's GPUs used over its samples (see
        :meth:`gpu_energy_many`)."""
        return self.gpu_energy_many([job_id]).get(job_id, [])

    def gpu_energy_many(self, job_ids: Sequence[int]) -> dict[int, list[GpuEnergy]]:
        """Per-GPU energy of many jobs, one windowed query per 500 jobs.

        The rule (:mod:`slurmgpu.store.energy_rule`): between two consecutive samples of
        one job on one GPU (at most ``ENERGY_MAX_GAP_S`` apart) the NVML counter's delta,
        else the trapezoid of the two power readings; idle energy where the closing sample
        shows the GPU idle; a shared GPU's energy split between the jobs on it. Hours the
        retention rolled up carry the same sums and are added to the raw samples left.
        """
        out: dict[int, list[GpuEnergy]] = {}
        ids = list(job_ids)
        for i in range(0, len(ids), 500):
            self._gpu_energy_chunk(ids[i : i + 500], out)
        return out

    def _gpu_energy_chunk(self, job_ids: list[int], out: dict[int, list[GpuEnergy]]) -> None:
        s, h = schema.samples, schema.sample_hours
        q = energy_rows([s.c.cluster == self.cluster, s.c.job_id.in_(job_ids), s.c.kind == "gpu"]).c
        raw = select(
            q.job_id,
            q.node,
            q.gpu_index,
            func.count().label("n"),
            *energy_sums(q),
            func.min(q.at).label("first_at"),
            func.max(q.at).label("last_at"),
        ).group_by(q.job_id, q.node, q.gpu_index)
        # Hours the retention rolled up (store/retention.py), with the same rule's sums;
        # the first and last power are those of the earliest and the latest hour.
        part = (h.c.job_id, h.c.node, h.c.gpu_index)
        hours = (
            select(
                *part,
                h.c.samples,
                h.c.energy_j,
                h.c.idle_energy_j,
                h.c.counter_intervals,
                h.c.power_intervals,
                h.c.covered_s,
                h.c.power_n,
                h.c.power_sum,
                h.c.first_at,
                h.c.last_at,
                func.first_value(h.c.first_power_w)
                .over(partition_by=part, order_by=h.c.first_at)
                .label("first_power_w"),
                func.first_value(h.c.last_power_w)
                .over(partition_by=part, order_by=h.c.last_at.desc())
                .label("last_power_w"),
            )
            .where(h.c.cluster == self.cluster, h.c.job_id.in_(job_ids), h.c.kind == "gpu")
            .subquery()
        )
        r_ = hours.c
        rolled = select(
            r_.job_id,
            r_.node,
            r_.gpu_index,
            func.sum(r_.samples).label("n"),
            func.sum(r_.energy_j).label("energy_j"),
            func.sum(r_.idle_energy_j).label("idle_energy_j"),
            func.sum(r_.counter_intervals).label("counter_intervals"),
            func.sum(r_.power_intervals).label("power_intervals"),
            func.sum(r_.covered_s).label("covered_s"),
            func.sum(r_.power_n).label("power_n"),
            func.sum(r_.power_sum).label("power_sum"),
            func.max(r_.first_power_w).label("first_power_w"),
            func.max(r_.last_power_w).label("last_power_w"),
            func.min(r_.first_at).label("first_at"),
            func.max(r_.last_at).label("last_at"),
        ).group_by(r_.job_id, r_.node, r_.gpu_index)
        merged: dict[tuple[int, str, int], dict[str, Any]] = {}
        with self.engine.connect() as conn:
            for stmt in (rolled, raw):
                for r in conn.execute(stmt).mappings():
                    key = (int(r["job_id"]), str(r["node"]), int(r["gpu_index"]))
                    row = dict(r)
                    row["first_at"], row["last_at"] = as_utc(r["first_at"]), as_utc(r["last_at"])
                    merged[key] = _merge_energy(merged[key], row) if key in merged else row
        for key in sorted(merged):
            g = merged[key]
            power_n = int(g["power_n"] or 0)
            out.setdefault(key[0], []).append(
                GpuEnergy(
                    node=key[1],
                    gpu_index=key[2],
                    samples=int(g["n"]),
                    energy_j=float(g["energy_j"] or 0.0),
                    idle_energy_j=float(g["idle_energy_j"] or 0.0),
                    counter_intervals=int(g["counter_intervals"] or 0),
                    power_intervals=int(g["power_intervals"] or 0),
                    covered_s=float(g["covered_s"] or 0.0),
                    mean_power_w=float(g["power_sum"]) / power_n if power_n else None,
                    first_power_w=_f(g["first_power_w"]),
                    last_power_w=_f(g["last_power_w"]),
                    first_at=g["first_at"],
                    last_at=g["last_at"],
                )
            )

    def host_usage(self, job_id: int) -> list[HostUsage]:
        """Return per-node CPU and memory aggregates of a job (raw and rolled-up hours)."""
        s, h = schema.samples, schema.sample_hours
        mem = func.coalesce(s.c.cgroup_memory_mib, s.c.rss_mib)
        raw = (
            select(
                s.c.node,
                func.count().label("n"),
                func.count(s.c.cpu_pct).label("cpu_n"),
                func.sum(s.c.cpu_pct).label("cpu_sum"),
                func.max(s.c.cpu_pct).label("max_cpu"),
                func.max(s.c.cpus_allocated).label("cpus"),
                func.max(mem).label("max_mem"),
                func.count(s.c.iowait_pct).label("iowait_n"),
                func.sum(s.c.iowait_pct).label("iowait_sum"),
            )
            .where(and_(s.c.cluster == self.cluster, s.c.job_id == job_id, s.c.kind == "host"))
            .group_by(s.c.node)
        )
        rolled = (
            select(
                h.c.node,
                func.sum(h.c.samples).label("n"),
                func.sum(h.c.cpu_n).label("cpu_n"),
                func.sum(h.c.cpu_sum).label("cpu_sum"),
                func.max(h.c.cpu_max).label("max_cpu"),
                func.max(h.c.cpus_max).label("cpus"),
                func.max(h.c.host_memory_max_mib).label("max_mem"),
                func.coalesce(func.sum(h.c.iowait_n), 0).label("iowait_n"),
                func.sum(h.c.iowait_sum).label("iowait_sum"),
            )
            .where(and_(h.c.cluster == self.cluster, h.c.job_id == job_id, h.c.kind == "host"))
            .group_by(h.c.node)
        )
        merged: dict[str, dict[str, Any]] = {}
        with self.engine.connect() as conn:
            for stmt in (rolled, raw):
                for r in conn.execute(stmt).mappings():
                    row = dict(r)
                    node = str(row["node"])
                    merged[node] = _merge(merged[node], row) if node in merged else row
        out = []
        for node in sorted(merged):
            u = merged[node]
            cpu_n = int(u["cpu_n"] or 0)
            iowait_n = int(u["iowait_n"] or 0)
            out.append(
                HostUsage(
                    node=node,
                    samples=int(u["n"]),
                    mean_cpu_pct=float(u["cpu_sum"]) / cpu_n if cpu_n else None,
                    max_cpu_pct=_f(u["max_cpu"]),
                    cpus_allocated=int(u["cpus"]) if u["cpus"] is not None else None,
                    max_memory_mib=_f(u["max_mem"]),
                    mean_iowait_pct=float(u["iowait_sum"]) / iowait_n if iowait_n else None,
                )
            )
        return out

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
            why = one_line(exc)
            raise StoreError(f"could not store the summary of job {job_id}: {why}") from exc

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


_SUMMED = frozenset(
    {"n", "util_n", "util_sum", "errors", "cpu_n", "cpu_sum", "iowait_n", "iowait_sum"}
)
_FIRST = frozenset({"first_at"})


def _merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Combine two aggregate rows of one GPU or node: counts and sums add, others max."""
    out = dict(a)
    for key, value in b.items():
        mine = out.get(key)
        if value is None or key in {"job_id", "node", "gpu_index"}:
            continue
        if mine is None:
            out[key] = value
        elif key in _SUMMED:
            out[key] = mine + value
        elif key in _FIRST:
            out[key] = min(mine, value)
        else:
            out[key] = max(mine, value)
    return out


_ENERGY_SUMMED = (
    "n",
    "energy_j",
    "idle_energy_j",
    "counter_intervals",
    "power_intervals",
    "covered_s",
    "power_n",
    "power_sum",
)


def _merge_energy(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Combine the energy of one GPU's rolled-up hours and raw samples (disjoint spans)."""
    out = dict(a)
    for key in _ENERGY_SUMMED:
        if b[key] is not None:
            out[key] = b[key] if out[key] is None else out[key] + b[key]
    if b["first_at"] < a["first_at"]:
        out["first_at"], out["first_power_w"] = b["first_at"], b["first_power_w"]
    if b["last_at"] > a["last_at"]:
        out["last_at"], out["last_power_w"] = b["last_at"], b["last_power_w"]
    return out


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
