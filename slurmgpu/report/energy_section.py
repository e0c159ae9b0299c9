"""The report's energy section: GPU energy of the window's jobs, per user/account/partition.

Read from the end-of-job summaries (``job_summaries.energy_j`` / ``idle_energy_j``,
written by the daemon from the NVML energy counter or power samples; see
report/energy.py) with one grouped query over the window's jobs, the same jobs the rest
of the report counts (ended in ``[since, until)``, terminal, asked for GPUs, shards or
MPS).
Jobs whose summary has no energy (no agent, no power readings, or summarised before
migration 0007) are counted in ``jobs`` but not in ``jobs_measured``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection, and_, func, or_, select

from slurmgpu.report.energy import J_PER_KWH
from slurmgpu.report.job_rows import TERMINAL_STATES, GroupBy
from slurmgpu.store import schema

__all__ = ["EnergyFigures", "EnergyRow", "EnergySection", "energy_section"]


@dataclass(frozen=True, slots=True)
class EnergyFigures:
    """GPU energy of a set of jobs."""

    jobs: int
    jobs_measured: int
    kwh: float
    idle_kwh: float

    @property
    def idle_pct(self) -> float | None:
        return 100.0 * self.idle_kwh / self.kwh if self.kwh > 0 else None

    @property
    def kwh_per_job(self) -> float | None:
        return self.kwh / self.jobs_measured if self.jobs_measured else None


@dataclass(frozen=True, slots=True)
class EnergyRow:
    name: str
    figures: EnergyFigures


@dataclass(frozen=True, slots=True)
class EnergySection:
    totals: EnergyFigures
    groups: tuple[EnergyRow, ...]  # most kWh first

    def by_name(self) -> dict[str, EnergyFigures]:
        return {g.name: g.figures for g in self.groups}


def energy_section(
    conn: Connection, cluster: str, since: datetime, until: datetime, by: GroupBy
) -> EnergySection:
    """The energy of the jobs that ended in ``[since, until)``, grouped by ``by``."""
    j, s = schema.jobs, schema.job_summaries
    summary_of_run = and_(  # the summary written after this run started (job_rows)
        s.c.cluster == j.c.cluster,
        s.c.job_id == j.c.job_id,
        s.c.created_at >= j.c.start_time,
    )
    grp = j.c[by]
    stmt = (
        select(
            grp.label("grp"),
            func.count(func.distinct(j.c.id)).label("jobs"),
            func.count(s.c.energy_j).label("measured"),
            func.coalesce(func.sum(s.c.energy_j), 0.0).label("joules"),
            func.coalesce(func.sum(s.c.idle_energy_j), 0.0).label("idle_joules"),
        )
        .select_from(j.outerjoin(s, summary_of_run))
        .where(
            j.c.cluster == cluster,
            j.c.end_time >= since,
            j.c.end_time < until,
            j.c.state.in_(TERMINAL_STATES),
            j.c.start_time.is_not(None),
            or_(j.c.gpus > 0, j.c.shards > 0, j.c.mps > 0),
        )
        .group_by(grp)
    )
    rows = [
        EnergyRow(
            str(r.grp or ""),
            EnergyFigures(
                jobs=int(r.jobs),
                jobs_measured=int(r.measured or 0),
                kwh=float(r.joules) / J_PER_KWH,
                idle_kwh=float(r.idle_joules) / J_PER_KWH,
            ),
        )
        for r in conn.execute(stmt)
    ]
    rows.sort(key=lambda g: (-g.figures.kwh, g.name))
    totals = EnergyFigures(
        jobs=sum(g.figures.jobs for g in rows),
        jobs_measured=sum(g.figures.jobs_measured for g in rows),
        kwh=sum(g.figures.kwh for g in rows),
        idle_kwh=sum(g.figures.idle_kwh for g in rows),
    )
    return EnergySection(totals, tuple(rows))
