"""What jobs did with their GPUs, CPUs and energy, from the stored samples (the raw ones and
the hours retention rolled up), and the end-of-job summaries kept for them.

Aggregation happens in the database (works on SQLite and PostgreSQL), never in Python
loops over samples.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Engine, and_, case, func, insert, select
from sqlalchemy.exc import SQLAlchemyError

from slurmgpu.store import schema
from slurmgpu.store.database import StoreError
from slurmgpu.store.energy_rule import IDLE_UTIL_PCT, energy_rows, energy_sums, not_idle_at
from slurmgpu.store.health import one_line
from slurmgpu.store.schema import as_utc
from slurmgpu.store.summary_columns import energy_columns, summary_columns

# A GPU's mean util is known when at most this share of its samples that were read (not
# errors) had an unknown util: an MPS job whose only known samples are the 0 % ones from
# before its processes started, or a MIG slice without GPM, is "util unknown", never idle.
# Within it the mean of the known samples is off by at most 10 points.
MAX_UNKNOWN_UTIL_SHARE = 0.1


def known_mean_util(samples: int, util_n: int, util_sum: float, errors: int) -> float | None:
    """The mean of the known util samples, or None when too many were unknown.

    >>> known_mean_util(30, 2, 0.0, 0), known_mean_util(30, 28, 280.0, 0)
    (None, 10.0)
    """
    measured = samples - errors
    unknown = measured - util_n
    if util_n <= 0 or unknown > MAX_UNKNOWN_UTIL_SHARE * measured:
        return None
    return util_sum / util_n


class UsageQuery:
    """Answers per-job usage questions; stores and reads end-of-job summaries."""

    def __init__(self, engine: Engine, cluster: str = "") -> None:
        self.engine = engine
        self.cluster = cluster

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
        busy = not_idle_at(s)
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
            last_busy = g["last_busy_at"]  # busy, or a process of unknown util
            idle_since = first if last_busy is None else last_busy
            max_util = _f(g["max_util"])
            never_busy = max_util is None or max_util <= IDLE_UTIL_PCT
            util_n = int(g["util_n"] or 0)
            mean_util = known_mean_util(
                int(g["n"]), util_n, float(g["util_sum"] or 0.0), int(g["errors"] or 0)
            )
            out.setdefault(key[0], []).append(
                GpuUsage(
                    node=key[1],
                    gpu_index=key[2],
                    samples=int(g["n"]),
                    mean_util_pct=mean_util,
                    max_util_pct=_f(g["max_util"]),
                    max_memory_mib=_f(g["max_mem"]),
                    memory_total_mib=_f(g["mem_total"]),
                    first_at=first,
                    last_at=last,
                    trailing_idle=max(last - idle_since, timedelta(0)),
                    never_busy=never_busy,
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
