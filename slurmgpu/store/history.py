"""Finished jobs as the priors learn from them: the jobs table joined with summaries."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any, overload

import msgspec
from sqlalchemy import Engine, Text, and_, cast, or_, select
from sqlalchemy.exc import SQLAlchemyError

from slurmgpu.model import JobState
from slurmgpu.policy.base import HistoryRecord
from slurmgpu.policy.limit_restore import LIMIT_RESTORE_ALERT
from slurmgpu.store import schema
from slurmgpu.store.database import StoreError
from slurmgpu.store.health import one_line
from slurmgpu.store.schema import as_utc

log = logging.getLogger(__name__)

_FINISHED = [s.value for s in JobState if s.is_terminal and s is not JobState.UNKNOWN]


# What the priors read of a summary, decoded straight from its JSON text (the rest of it
# skipped unparsed): 4x less CPU than json.loads and a walk of the dicts, which took half
# of a whole read (3.2 s on 200,000 jobs). A summary these do not fit (not as our daemon
# writes them) goes the general way, _from_summary.
class _GpuFigures(msgspec.Struct):
    util_pct_mean: float | None = None
    memory_max_mib: float | None = None
    never_busy: bool | None = True


class _HostFigures(msgspec.Struct):
    memory_max_mib: float | None = None
    cpu_pct_mean: float | None = None


class _NodeFigures(msgspec.Struct):
    host: _HostFigures | None = None
    gpus: dict[str, _GpuFigures] | None = None


class _SummaryFigures(msgspec.Struct):
    nodes: dict[str, _NodeFigures] | None = None


_decode_figures = msgspec.json.Decoder(_SummaryFigures).decode


def _usage(text: str | bytes | None) -> dict[str, float | int | None]:
    """The figures :func:`_from_summary` gives for a summary's JSON text (None: no
    summary); a summary that is not a JSON object of the daemon's shape gives none."""
    if text is None:
        return {}
    try:
        figures = _decode_figures(text)
    except msgspec.DecodeError:
        try:
            return _from_summary(json.loads(text))
        except (ValueError, TypeError, AttributeError) as exc:
            log.debug("a job summary not read for the history: %s", exc)
            return {}
    return _totals((figures.nodes or {}).values())


def _from_summary(summary: Mapping[str, Any] | None) -> dict[str, float | int | None]:
    """Peak memory, mean CPU, GPU util, peak GPU memory and GPUs used, from a parsed
    summary: the general way, for one the typed decoder of :func:`_usage` refuses
    (numbers as strings, an empty host); raises on one that is no mapping of mappings."""
    if not summary:
        return {}
    nodes = []
    for node in (summary.get("nodes") or {}).values():
        host = node.get("host") or {}
        gpus = {
            index: _GpuFigures(
                _float(gpu.get("util_pct_mean")),
                _float(gpu.get("memory_max_mib")),
                bool(gpu.get("never_busy", True)),
            )
            for index, gpu in (node.get("gpus") or {}).items()
        }
        figures = _HostFigures(_float(host.get("memory_max_mib")), _float(host.get("cpu_pct_mean")))
        nodes.append(_NodeFigures(figures, gpus))
    return _totals(nodes)


def _totals(nodes: Iterable[_NodeFigures]) -> dict[str, float | int | None]:
    """The job's figures over its nodes: memory peaks summed (the job's) and the largest
    (a node's), CPU summed, GPU utilisation averaged, the largest GPU memory peak, and
    how many GPUs were ever busy (None without any GPU utilisation)."""
    peak_mem = peak_node = cpu = None
    utils: list[float] = []
    gpu_mem: list[float] = []
    used = 0
    for node in nodes:
        host = node.host
        if host is not None:
            if host.memory_max_mib is not None:
                node_peak = host.memory_max_mib
                peak_mem = (peak_mem or 0.0) + node_peak  # the job's total over its nodes
                peak_node = max(peak_node or 0.0, node_peak)
            if host.cpu_pct_mean is not None:
                cpu = (cpu or 0.0) + host.cpu_pct_mean
        for gpu in (node.gpus or {}).values():
            if gpu.util_pct_mean is not None:
                utils.append(gpu.util_pct_mean)
            if gpu.memory_max_mib is not None:
                gpu_mem.append(gpu.memory_max_mib)
            if not gpu.never_busy:
                used += 1
    return {
        "peak_memory_mib": peak_mem,
        "peak_node_memory_mib": peak_node,
        "mean_cpu_pct": cpu,
        "mean_gpu_util_pct": sum(utils) / len(utils) if utils else None,
        "peak_gpu_memory_mib": max(gpu_mem) if gpu_mem else None,
        "gpus_used": used if utils else None,
    }


def load_history(engine: Engine, cluster: str, since: datetime) -> list[HistoryRecord]:
    """Return finished jobs that ended after ``since``, with their usage when known: one
    record per job (its newest summary), oldest end first.

    User, name, partition and state strings are interned: a history holds few distinct
    ones, and the daemon reloads it every few minutes. One object per distinct string
    keeps 200,000 records small, and the priors' grouping and their comparison with the
    last reload (``Priors.carry_over``) then hash and compare by identity. The daemon
    reloads through a :class:`HistoryLoader`, which reads only what was written since.
    """
    return list(_read(engine, cluster, since).values())


class HistoryLoader:
    """The history window, read whole once, then only the jobs written since.

    A whole read of 200,000 finished jobs costs ~3.5 s CPU on SQLite (JSON summaries,
    rows, records), every ``history_refresh`` (10 min) inside a policy cycle. A reload
    reads only the job rows and summaries written since the last load (the observer's
    ``updated_at``, the summary's ``created_at``; ``overlap`` earlier, against a clock
    step), ~0.12 s on that store, keeps the other records and drops those that left the
    window. A job among those read that is no longer a finished job in the window (one
    requeued after it failed) leaves the history. Every ``full_every`` the window is read
    whole again, which also catches rows deleted or written with an older clock.

    A record read again (the overlap, a whole read) that equals the last load's is
    handed out as that object: the priors' comparison with the last reload
    (``Priors.carry_over``) is then by identity, not field by field (~80 ms on 200,000
    records, in the cycle).
    """

    def __init__(
        self,
        engine: Engine,
        cluster: str,
        *,
        overlap: timedelta = timedelta(minutes=10),
        full_every: timedelta = timedelta(hours=6),
    ) -> None:
        self.engine = engine
        self.cluster = cluster
        self.overlap = overlap
        self.full_every = full_every
        self._records: dict[int, HistoryRecord] = {}  # jobs row id -> record
        self._full_at: datetime | None = None  # when the window was last read whole
        self._read_at: datetime | None = None  # when it was last read at all
        self.last_read = 0  # rows the last load read (whole: every job of the window)
        self._timeouts: dict[int, HistoryRecord] = {}  # audit row id -> killed run

    def load(self, since: datetime, at: datetime) -> tuple[HistoryRecord, ...]:
        """Return the finished jobs that ended after ``since`` (as :func:`load_history`),
        read whole or by what was written since the last load; raises StoreError."""
        last = self._records
        if self._full_at is None or self._read_at is None or at - self._full_at >= self.full_every:
            whole = _read(self.engine, self.cluster, since)
            for rid, record in whole.items():
                before = last.get(rid)
                if before is not None and before == record:
                    whole[rid] = before
            self._records = whole
            self._full_at = self._read_at = at
            self.last_read = len(whole)
            return (*whole.values(), *self._restored(since))
        written = self._read_at - self.overlap
        changed = _read(self.engine, self.cluster, since, written_since=written)
        self._read_at = at
        self.last_read = len(changed)
        kept = {rid: r for rid, r in last.items() if r.ended_at >= since}
        for rid, read in changed.items():
            if read is None:
                kept.pop(rid, None)
            elif (before := kept.get(rid)) is None or before != read:
                kept[rid] = read
        self._records = kept
        return (*kept.values(), *self._restored(since))

    def _restored(self, since: datetime) -> list[HistoryRecord]:
        """A ``TIMEOUT`` record per run killed at a limit the daemon lowered and then
        restored (:mod:`slurmgpu.policy.limit_restore`), from the audit: the job's own
        row ends in the state of its last run, and the key's margin must still grow. The
        same objects from one load to the next (by audit row), few rows."""
        a = schema.actions
        stmt = (
            select(a.c.id, a.c.at, a.c.user, a.c.numbers)
            .where(
                and_(
                    a.c.cluster == self.cluster,
                    a.c.alert == LIMIT_RESTORE_ALERT,
                    a.c.outcome == "done",
                    a.c.at >= since,
                )
            )
            .order_by(a.c.at, a.c.id)
        )
        try:
            with self.engine.connect() as conn:
                rows = conn.execute(stmt).all()
        except SQLAlchemyError as exc:
            raise StoreError(f"could not read the restored time limits: {one_line(exc)}") from exc
        known, out = self._timeouts, {}
        for row_id, at, user, numbers in rows:
            record = known.get(int(row_id))
            if record is None:
                record = _timeout_record(user, numbers or {}, as_utc(at))
            if record is not None:
                out[int(row_id)] = record
        self._timeouts = out
        return list(out.values())


def _timeout_record(user: str, n: Mapping[str, Any], at: datetime) -> HistoryRecord | None:
    """The killed run of a restore's audit numbers, or None when they do not read."""
    try:
        run_s, limit_s = float(n["run_time_s"]), float(n["time_limit_s"])
        return HistoryRecord(
            user=sys.intern(user),
            name=sys.intern(str(n["name"])),
            partition=sys.intern(str(n.get("partition") or "")),
            script_hash=None,
            state="TIMEOUT",
            run_time=timedelta(seconds=max(0.0, run_s)),
            time_limit=timedelta(seconds=limit_s),
            gpus_requested=int(n.get("gpus") or 0),
            gpus_used=None,
            cpus=int(n.get("cpus") or 0),
            memory_requested_mib=None,
            peak_memory_mib=None,
            mean_cpu_pct=None,
            mean_gpu_util_pct=None,
            peak_gpu_memory_mib=None,
            ended_at=at,
            restarts=int(n.get("restarts") or 0),
        )
    except (KeyError, TypeError, ValueError, OverflowError):
        return None


@overload
def _read(engine: Engine, cluster: str, since: datetime) -> dict[int, HistoryRecord]: ...


@overload
def _read(
    engine: Engine, cluster: str, since: datetime, written_since: datetime
) -> dict[int, HistoryRecord | None]: ...


def _read(
    engine: Engine, cluster: str, since: datetime, written_since: datetime | None = None
) -> dict[int, HistoryRecord] | dict[int, HistoryRecord | None]:
    """Jobs row id -> record of the finished jobs that ended at or after ``since``, oldest
    end first, each with its newest summary. With ``written_since``: only the jobs whose
    row or a summary was written since then, whatever they are; those that are not a
    finished job of the window map to None, so a caller can forget them."""
    intern = sys.intern
    j, s = schema.jobs, schema.job_summaries
    if written_since is None:
        where = and_(
            j.c.cluster == cluster,
            j.c.state.in_(_FINISHED),
            j.c.end_time >= since,
            j.c.start_time.is_not(None),
        )
    else:  # a scan of the jobs table: ~0.12 s on 200,000 rows, no index needed
        where = and_(
            j.c.cluster == cluster,
            or_(j.c.updated_at >= written_since, s.c.created_at >= written_since),
        )
    stmt = (
        select(
            j.c.id,
            j.c.user,
            j.c.name,
            j.c.partition,
            j.c.state,
            j.c.start_time,
            j.c.end_time,
            j.c.time_limit_s,
            j.c.gpus,
            j.c.cpus,
            j.c.memory_mib,
            j.c.restart_count,
            cast(s.c.summary, Text),  # decoded here, by _usage
        )
        .select_from(j.outerjoin(s, and_(s.c.cluster == j.c.cluster, s.c.job_id == j.c.job_id)))
        .where(where)
        .order_by(j.c.end_time, j.c.id, s.c.id)  # a job's newest summary last
    )
    finished = frozenset(_FINISHED)
    out: dict[int, HistoryRecord | None] = {}
    try:
        with engine.connect() as conn:
            for (
                row_id,
                user,
                name,
                partition,
                state,
                started,
                ended,
                time_limit_s,
                gpus,
                cpus,
                memory_mib,
                restart_count,
                summary,
            ) in conn.execute(stmt):
                rid = int(row_id)
                if state not in finished or started is None or ended is None:
                    out[rid] = None
                    continue
                start, end = as_utc(started), as_utc(ended)
                if end < since:
                    out[rid] = None
                    continue
                usage = _usage(summary)
                out[rid] = HistoryRecord(
                    user=intern(user),
                    name=intern(name),
                    partition=intern(partition),
                    script_hash=None,
                    state=intern(state),
                    run_time=max(end - start, timedelta(0)),
                    time_limit=timedelta(seconds=time_limit_s)
                    if time_limit_s is not None
                    else None,
                    gpus_requested=int(gpus),
                    gpus_used=_int(usage.get("gpus_used")),
                    cpus=int(cpus),
                    memory_requested_mib=memory_mib,
                    peak_memory_mib=_float(usage.get("peak_memory_mib")),
                    peak_node_memory_mib=_float(usage.get("peak_node_memory_mib")),
                    mean_cpu_pct=_float(usage.get("mean_cpu_pct")),
                    mean_gpu_util_pct=_float(usage.get("mean_gpu_util_pct")),
                    peak_gpu_memory_mib=_float(usage.get("peak_gpu_memory_mib")),
                    ended_at=end,
                    restarts=int(restart_count or 0),
                )
    except SQLAlchemyError as exc:
        raise StoreError(f"could not read the job history: {one_line(exc)}") from exc
    return out


def _float(v: float | int | None) -> float | None:
    return None if v is None else float(v)


def _int(v: float | int | None) -> int | None:
    return None if v is None else int(v)
