"""Which transaction carries a ``resize`` decision out, and what the transactions say
afterwards: one dispatcher for the daemon (``actuate.malleable.MalleableActuator``, over
the SQL store and its audit) and the simulator (``sim.run``, over
``cycle.transactions.MemoryTransactions`` and SimSlurm's acknowledgements).

A job goes to :class:`~slurmgpu.cycle.resize.ResizeExecutor`, an array pool (its spec
says ``pool``) to :class:`~slurmgpu.cycle.pool.PoolExecutor`. Time is never read here:
every call takes the moment it happens at (``at``), the daemon's wall clock or the
simulator's virtual one.

No store here: the simulator loads this module without SQLAlchemy.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from slurmgpu.cycle.pool import KIND as POOL_KIND
from slurmgpu.cycle.pool import OPEN as POOL_OPEN
from slurmgpu.cycle.pool import PoolExecutor
from slurmgpu.cycle.resize import (
    CLOSED,
    KIND,
    ResizeError,
    ResizeExecutor,
    ResizeSettings,
    median_phases,
)
from slurmgpu.cycle.transactions import AckReader, TransactionRow, Transactions
from slurmgpu.model import ClusterSnapshot, MalleableSpec
from slurmgpu.policy.base import RESIZE, Action, Decision, resize_sizes
from slurmgpu.slurm.client import SlurmClient, SlurmError

__all__ = ["Outcome", "ResizeDispatcher"]

log = logging.getLogger("slurmgpu.actuate.malleable")


@dataclass(frozen=True, slots=True)
class Outcome:
    """What became of one resize decision: ``done`` (its transaction started, ``row``),
    ``failed`` (``error`` says why: not malleable, out of range, in flight, refused...),
    ``notified`` (advice) or ``skipped`` (held back, not told)."""

    outcome: str
    error: str | None = None
    row: TransactionRow | None = None


class ResizeDispatcher:
    """Starts and advances the resize transactions of jobs and array pools.

    Raises what the executors raise (``ResizeError``, ``SlurmError``, ``ValueError``,
    and whatever the transaction store raises); the daemon's actuator turns them into
    audited outcomes, the simulator into its own.
    """

    def __init__(
        self,
        slurm: SlurmClient,
        transactions: Transactions,
        settings: ResizeSettings | None = None,
        acks: AckReader | None = None,
    ) -> None:
        self.transactions = transactions
        self.settings = settings or ResizeSettings()
        self.jobs = ResizeExecutor(slurm, transactions, self.settings, acks)
        self.pools = PoolExecutor(slurm, transactions, self.settings.ack_timeout, acks)
        self._open: frozenset[int] = frozenset()

    def recover(self, at: datetime) -> int:
        """On daemon start: see :meth:`ResizeExecutor.recover`."""
        n = self.jobs.recover(at) + self.pools.recover(at)
        self.refresh()
        return n

    def refresh(self) -> None:
        rows = self.jobs.open() + self.transactions.in_states([POOL_KIND], POOL_OPEN)
        self._open = frozenset(r.job_id for r in rows)

    @property
    def in_flight(self) -> frozenset[int]:
        """Jobs (and pool array ids) with an open transaction, as of the last advance."""
        return self._open

    def advance(self, cluster: ClusterSnapshot, at: datetime) -> None:
        """Carry every open transaction forward as far as ``cluster`` (seen at ``at``) allows."""
        self.jobs.advance(cluster, at)
        self.pools.advance(cluster, at)
        self.refresh()

    def start(
        self,
        action: Action,
        cluster: ClusterSnapshot,
        specs: Mapping[int, MalleableSpec],
        at: datetime,
    ) -> TransactionRow:
        """Start the transaction for one ``resize`` action: a pool's or a job's."""
        if action.kind != RESIZE:
            raise ValueError(f"not a resize: {action.kind}")
        _, to = resize_sizes(action)
        spec = specs.get(action.job_id)
        if spec is not None and spec.pool:
            tasks = [j for j in cluster.jobs if j.array_job_id == action.job_id]
            row = self.pools.start(action, tasks, spec, at=at, to_tasks=to)
        else:
            job = cluster.jobs_by_id().get(action.job_id)
            if job is None:
                raise ResizeError(f"job {action.job_id} is not in the snapshot")
            row = self.jobs.start(
                action, job, spec, at=at, slurm_version=cluster.slurm_version, to_gpus=to
            )
        self.refresh()  # in flight from now on
        return row

    def carry_out(
        self,
        decision: Decision,
        cluster: ClusterSnapshot,
        specs: Mapping[int, MalleableSpec],
        at: datetime,
    ) -> Outcome:
        """One resize decision's outcome: its transaction started when it executes.

        Refusals (``ResizeError``, ``SlurmError``, ``ValueError``) are ``failed``; what
        the transaction store raises is the caller's (the daemon's ``StoreError``).
        """
        action = decision.action
        if action.kind != RESIZE:
            raise ValueError(f"not a resize: {action.kind}")
        if not decision.execute:
            if not decision.notify:
                return Outcome("skipped")
            log.info("advice for job %d (%s): %s", action.job_id, action.policy, action.reason)
            return Outcome("notified")
        try:
            row = self.start(action, cluster, specs, at)
        except (ResizeError, SlurmError, ValueError) as exc:
            log.warning("resize of job %d not started: %s", action.job_id, exc)
            return Outcome("failed", str(exc))
        return Outcome("done", None, row)

    def history(self, limit: int = 50) -> tuple[timedelta | None, dict[int, datetime]]:
        """(median decision → running time of recent resizes, last finished resize per job)."""
        rows = self.transactions.recent([KIND], limit=limit)
        phases = median_phases(rows)
        cost = timedelta(seconds=phases["total"]) if "total" in phases else None
        last: dict[int, datetime] = {}
        for row in rows:
            if row.state in CLOSED and row.job_id not in last:
                last[row.job_id] = row.updated_at
        return cost, last
