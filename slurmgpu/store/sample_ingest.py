"""Agents' samples into the store: checked against where and when jobs ran, held while
their job is unknown, and stored once each (an idempotent batched INSERT).
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from sqlalchemy import Engine, func, select
from sqlalchemy.exc import OperationalError, SQLAlchemyError

from slurmgpu.store import schema
from slurmgpu.store.database import StoreError, durable_begin
from slurmgpu.store.health import Cause, Diagnosis, StoreHealth, classify, sqlite_file
from slurmgpu.store.sample_check import NOT_ON_NODE, JobRun, misfit
from slurmgpu.store.sample_hold import SampleHold
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


class SampleIngest:
    """Writes agents' samples: checked against where and when jobs ran, held, stored once."""

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
            # Durable before the reply: an agent deletes a batch from its spool once the
            # daemon says it is stored, so a commit lost with the disk (SQLite's NORMAL
            # sync keeps it only from a process crash) would lose samples for good.
            with durable_begin(self.engine) as conn:
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
