"""The energy rule: what a GPU consumed between two samples of one job, in SQL.

One home for the rule, used by the reader (:meth:`slurmgpu.store.usage_query.UsageQuery.
gpu_energy_many`, over the raw samples left) and by the rollup
(:func:`slurmgpu.store.retention.roll_up_and_prune`, over the samples it is about to
delete), so a job's energy is the same before and after its samples are pruned.

Between a sample and the next sample of the same job on the same GPU (at most
``ENERGY_MAX_GAP_S`` apart) the energy is the NVML counter's delta when both carry the
counter and it did not go back (a driver reload), else the trapezoid of the two power
readings. The interval is idle energy when the closing sample shows the GPU idle (util
<= ``IDLE_UTIL_PCT``: NVML's util covers the window before the reading; an unknown util
is not idle), and on a shared
GPU it is split evenly between the jobs sampled on it at the closing instant.

Each interval is counted with its *opening* sample. The rollup of an hour therefore
counts the interval from the hour's last sample to the next hour's first one (still raw
when the hour is rolled up: the next sample is read up to ``ENERGY_MAX_GAP_S`` past the
hour), and the reader, which no longer sees the pruned opening sample, does not count it
again: merged rollups + raw samples give the energy of the raw samples exactly (up to
float summation order). The one loss: an interval whose closing sample reaches the store
only after its opening sample's hour was rolled up (a node's spool delivered more than
``daemon.sample_retention`` late) is not counted, at most ``ENERGY_MAX_GAP_S`` per GPU per
such hour.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, case, func, literal, select
from sqlalchemy.sql.elements import ColumnElement, Label
from sqlalchemy.sql.selectable import Subquery

from slurmgpu.store import schema
from slurmgpu.store.sql_dialect import epoch_s

__all__ = ["ENERGY_MAX_GAP_S", "IDLE_UTIL_PCT", "energy_rows", "energy_sums", "not_idle_at"]

# A GPU counts as busy in a sample above this utilisation (NVML reports integers).
IDLE_UTIL_PCT = 0.5
# Two samples of one GPU further apart than this (agent down, job requeued onto the same
# GPU) bound no energy interval: what happened between them is unknown.
ENERGY_MAX_GAP_S = 900.0


def not_idle_at(s: Any) -> ColumnElement[Any]:
    """A sample's time when it does not show its GPU idle, else NULL: busy (util above
    ``IDLE_UTIL_PCT``), or a process of the job ran with an unknown util (an MPS client
    sharing its GPU, a MIG slice without GPM), which must not count as idle time. The
    latest of these ends a GPU's trailing idle time (reader and rollup alike)."""
    unknown_use = and_(
        s.c.util_pct.is_(None),
        func.coalesce(s.c.processes, 0) > 0,
        func.coalesce(s.c.source, "") != "error",
    )
    return case((s.c.util_pct > IDLE_UTIL_PCT, s.c.at), (unknown_use, s.c.at), else_=None)


def energy_rows(
    where: list[ColumnElement[bool]], *, until: datetime | None = None, carry_all: bool = False
) -> Subquery:
    """The samples matching ``where``, each with what the rule needs of the next one.

    With ``until``, samples at or after it are read (up to ``ENERGY_MAX_GAP_S`` further)
    only to close the intervals of the samples before it; ``inwin`` is 1 for the samples
    before ``until`` (always 1 without it). ``carry_all`` keeps every sample column (the
    rollup needs them); otherwise only the job, node and GPU.
    """
    s = schema.samples
    peers = s.alias("peers")
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
    sharers = case((s.c.shared.is_(True), sharing), else_=literal(1))
    cond = list(where)
    if until is not None:
        cond.append(s.c.at < until + timedelta(seconds=ENERGY_MAX_GAP_S + 1.0))
        inwin: ColumnElement[Any] = case((s.c.at < until, 1), else_=0)
    else:
        inwin = literal(1)
    needed = ("job_id", "node", "kind", "gpu_index", "at", "util_pct", "power_w", "energy_mj")
    base: list[Any] = list(s.c) if carry_all else [s.c[name] for name in needed]
    first = (
        select(
            *base,
            epoch_s(s.c.at).label("t"),
            (1.0 / func.coalesce(func.nullif(sharers, 0), 1)).label("share"),
            inwin.label("inwin"),
        )
        .where(and_(*cond))
        .subquery()
    )
    a = first.c
    part = (a.job_id, a.node, a.kind, a.gpu_index)

    def nxt(col: ColumnElement[Any], label: str) -> Label[Any]:
        return func.lead(col).over(partition_by=part, order_by=a.at).label(label)

    return select(
        *first.c,
        func.lag(a.t).over(partition_by=part, order_by=a.at).label("prev_t"),
        nxt(a.t, "next_t"),
        nxt(a.power_w, "next_power"),
        nxt(a.energy_mj, "next_energy"),
        nxt(a.util_pct, "next_util"),
        nxt(a.share, "next_share"),
        nxt(a.inwin, "next_inwin"),
    ).subquery()


def energy_sums(q: Any) -> list[Label[Any]]:
    """Grouped aggregates of :func:`energy_rows` (the rule applied to each interval).

    ``energy_j``, ``idle_energy_j``, ``counter_intervals``, ``power_intervals``,
    ``covered_s``; ``power_n``/``power_sum`` (readings with power, their shared-split
    sum: the mean power); ``first_power_w``/``last_power_w``: the (split) power of the
    group's first and last sample.
    """
    dt = q.next_t - q.t
    near = and_(q.next_t.is_not(None), dt <= ENERGY_MAX_GAP_S)
    by_counter = and_(
        near,
        q.energy_mj.is_not(None),
        q.next_energy.is_not(None),
        q.next_energy >= q.energy_mj,
    )
    by_power = and_(near, q.power_w.is_not(None), q.next_power.is_not(None))
    joules = case(
        (by_counter, (q.next_energy - q.energy_mj) / 1000.0 * q.next_share),
        (by_power, (q.power_w + q.next_power) / 2.0 * dt * q.next_share),
        else_=None,
    )
    # unknown util (an MPS client sharing its GPU, a MIG slice without GPM) is not idle
    idle = and_(q.next_util.is_not(None), q.next_util <= IDLE_UTIL_PCT)
    last = func.coalesce(q.next_inwin, 0) == 0
    return [
        func.sum(joules).label("energy_j"),
        func.sum(case((idle, joules), else_=None)).label("idle_energy_j"),
        func.sum(case((by_counter, 1), else_=0)).label("counter_intervals"),
        func.sum(case((and_(by_power, ~by_counter), 1), else_=0)).label("power_intervals"),
        func.sum(case((joules.is_not(None), dt), else_=None)).label("covered_s"),
        func.count(q.power_w).label("power_n"),
        func.sum(q.power_w * q.share).label("power_sum"),
        func.max(case((q.prev_t.is_(None), q.power_w * q.share), else_=None)).label(
            "first_power_w"
        ),
        func.max(case((last, q.power_w * q.share), else_=None)).label("last_power_w"),
    ]
