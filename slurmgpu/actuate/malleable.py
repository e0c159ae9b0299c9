"""Carries out the engine's ``resize`` decisions: jobs through cycle.resize, pools
through cycle.pool, each audited like every other decision.

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
from slurmgpu.cycle.dispatch import Outcome, ResizeDispatcher
from slurmgpu.cycle.resize import ResizeSettings
from slurmgpu.cycle.transactions import AckReader, Transactions
from slurmgpu.model import ClusterSnapshot, MalleableSpec
from slurmgpu.policy.base import Decision
from slurmgpu.slurm.client import SlurmClient
from slurmgpu.store.audit import AuditStore
from slurmgpu.store.database import StoreError

log = logging.getLogger("slurmgpu.actuate.malleable")

__all__ = ["MalleableActuator"]


class MalleableActuator:
    """Resize transactions for malleable jobs and array pools."""

    def __init__(
        self,
        slurm: SlurmClient,
        transactions: Transactions,
        audit: AuditStore,
        settings: ResizeSettings | None = None,
        acks: AckReader | None = None,
    ) -> None:
        self.transactions = transactions
        self.audit = audit
        # The dispatcher the simulator runs too (cycle.dispatch): jobs and pools; acks
        # from the jobs' ack.json unless given (tests replay the simulator's).
        self.dispatch = ResizeDispatcher(slurm, transactions, settings, acks)
        self.jobs = self.dispatch.jobs
        self.pools = self.dispatch.pools

    def recover(self, at: datetime) -> int:
        """On daemon start: see :meth:`ResizeExecutor.recover`; never raises."""
        try:
            return self.dispatch.recover(at)
        except StoreError as exc:
            log.error("resize transactions not recovered: %s", exc)
            return 0

    @property
    def in_flight(self) -> frozenset[int]:
        """Jobs (and pool array ids) with an open transaction, as of the last advance."""
        return self.dispatch.in_flight

    def busy(self) -> bool:
        return bool(self.dispatch.in_flight)

    def advance(self, cluster: ClusterSnapshot, at: datetime) -> None:
        """Carry every open transaction forward; never raises."""
        try:
            self.dispatch.advance(cluster, at)
        except StoreError as exc:
            log.warning("resize transactions not advanced this cycle: %s", exc)

    def history(self, limit: int = 50) -> tuple[timedelta | None, dict[int, datetime]]:
        """(median decision → running time of recent resizes, last finished resize per job)."""
        try:
            return self.dispatch.history(limit)
        except StoreError as exc:
            log.warning("resize history not read: %s", exc)
            return None, {}

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
        results = []
        for decision, action_id in zip(decisions, ids, strict=True):
            results.append(self._one(decision, action_id, cluster, specs, at))
        return results

    def _one(
        self,
        decision: Decision,
        action_id: int,
        cluster: ClusterSnapshot,
        specs: Mapping[int, MalleableSpec],
        at: datetime,
    ) -> ActuationResult:
        try:
            done = self.dispatch.carry_out(decision, cluster, specs, at)
        except StoreError as exc:
            log.warning("resize of job %d not started: %s", decision.action.job_id, exc)
            done = Outcome("failed", str(exc))
        outcome, error = done.outcome, done.error
        txn_id = done.row.id if done.row is not None else None
        try:
            self.audit.set_outcome(action_id, outcome, error)
            if txn_id is not None:
                self.audit.link_transaction(action_id, txn_id)
        except StoreError as exc:
            log.error("%s", exc)
        return ActuationResult(decision, action_id, outcome, error)
