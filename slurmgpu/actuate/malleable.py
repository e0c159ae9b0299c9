"""Carries out the engine's ``resize`` decisions: jobs through actuate.resize, pools
through actuate.pool, each audited like every other decision.

The daemon calls :meth:`MalleableActuator.advance` once per observe cycle (before the
policies decide, so they see which resizes are still in flight) and
:meth:`MalleableActuator.carry_out` with the cycle's resize decisions. The decision's
audit row is written first (outcome ``pending``); starting the transaction makes it
``done`` (the transaction then carries on over the next cycles, linked from the audit row)
or ``failed`` with the reason (not malleable, out of range, already in flight, Slurm
refused the signal...).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta

from slurmgpu.actuate.actuator import ActuationResult
from slurmgpu.actuate.pool import KIND as POOL_KIND
from slurmgpu.actuate.pool import PoolExecutor
from slurmgpu.actuate.resize import (
    CLOSED,
    KIND,
    ResizeError,
    ResizeExecutor,
    ResizeSettings,
    median_phases,
)
from slurmgpu.model import ClusterSnapshot, Job, MalleableSpec
from slurmgpu.policy.base import RESIZE, Decision, resize_sizes
from slurmgpu.slurm.client import SlurmClient, SlurmError
from slurmgpu.store.audit import AuditStore
from slurmgpu.store.database import StoreError
from slurmgpu.store.transactions import TransactionStore

log = logging.getLogger("slurmgpu.actuate.malleable")

__all__ = ["MalleableActuator"]


class MalleableActuator:
    """Resize transactions for malleable jobs and array pools."""

    def __init__(
        self,
        slurm: SlurmClient,
        transactions: TransactionStore,
        audit: AuditStore,
        settings: ResizeSettings | None = None,
    ) -> None:
        self.transactions = transactions
        self.audit = audit
        self.jobs = ResizeExecutor(slurm, transactions, settings)
        self.pools = PoolExecutor(slurm, transactions, (settings or ResizeSettings()).ack_timeout)
        self._open: frozenset[int] = frozenset()

    def recover(self, at: datetime) -> int:
        """On daemon start: see :meth:`ResizeExecutor.recover`; never raises."""
        try:
            n = self.jobs.recover(at) + self.pools.recover(at)
            self._refresh()
        except StoreError as exc:
            log.error("resize transactions not recovered: %s", exc)
            return 0
        return n

    def _refresh(self) -> None:
        rows = self.jobs.open() + self.transactions.in_states([POOL_KIND], ["signaled"])
        self._open = frozenset(r.job_id for r in rows)

    @property
    def in_flight(self) -> frozenset[int]:
        """Jobs (and pool array ids) with an open transaction, as of the last advance."""
        return self._open

    def busy(self) -> bool:
        return bool(self._open)

    def advance(self, cluster: ClusterSnapshot, at: datetime) -> None:
        """Carry every open transaction forward; never raises."""
        try:
            self.jobs.advance(cluster, at)
            self.pools.advance(cluster, at)
            self._refresh()
        except StoreError as exc:
            log.warning("resize transactions not advanced this cycle: %s", exc)

    def history(self, limit: int = 50) -> tuple[timedelta | None, dict[int, datetime]]:
        """(median decision → running time of recent resizes, last finished resize per job)."""
        try:
            rows = self.transactions.recent([KIND], limit=limit)
        except StoreError as exc:
            log.warning("resize history not read: %s", exc)
            return None, {}
        phases = median_phases(rows)
        cost = timedelta(seconds=phases["total"]) if "total" in phases else None
        last: dict[int, datetime] = {}
        for row in rows:
            if row.state in CLOSED and row.job_id not in last:
                last[row.job_id] = row.updated_at
        return cost, last

    def carry_out(
        self,
        decisions: Sequence[Decision],
        cluster: ClusterSnapshot,
        specs: Mapping[int, MalleableSpec],
        at: datetime,
    ) -> list[ActuationResult]:
        """Audit each resize decision, then start the transactions of those to execute."""
        if not decisions:
            return []
        try:
            ids = self.audit.record(decisions, at)
        except StoreError as exc:
            log.error("%s; no resize started this cycle", exc)
            return []
        jobs = cluster.jobs_by_id()
        results = []
        for decision, action_id in zip(decisions, ids, strict=True):
            results.append(self._one(decision, action_id, cluster, jobs, specs, at))
        self._refresh()
        return results

    def _one(
        self,
        decision: Decision,
        action_id: int,
        cluster: ClusterSnapshot,
        jobs: Mapping[int, Job],
        specs: Mapping[int, MalleableSpec],
        at: datetime,
    ) -> ActuationResult:
        action = decision.action
        if action.kind != RESIZE:
            raise ValueError(f"not a resize: {action.kind}")
        if not (decision.execute or decision.notify):
            return ActuationResult(decision, action_id, "skipped")
        outcome, error, txn_id = "notified", None, None
        if decision.execute:
            try:
                _, to = resize_sizes(action)
                spec = specs.get(action.job_id)
                if spec is not None and spec.pool:
                    tasks = [j for j in cluster.jobs if j.array_job_id == action.job_id]
                    row = self.pools.start(action, tasks, spec, at=at, to_tasks=to)
                else:
                    job = jobs.get(action.job_id)
                    if job is None:
                        raise ResizeError(f"job {action.job_id} is not in the snapshot")
                    row = self.jobs.start(
                        action, job, spec, at=at, slurm_version=cluster.slurm_version, to_gpus=to
                    )
                outcome, txn_id = "done", row.id
            except (ResizeError, SlurmError, ValueError, StoreError) as exc:
                outcome, error = "failed", str(exc)
                log.warning("resize of job %d not started: %s", action.job_id, exc)
        else:
            log.info("advice for job %d (%s): %s", action.job_id, action.policy, action.reason)
        try:
            self.audit.set_outcome(action_id, outcome, error)
            if txn_id is not None:
                self.audit.link_transaction(action_id, txn_id)
        except StoreError as exc:
            log.error("%s", exc)
        return ActuationResult(decision, action_id, outcome, error)
