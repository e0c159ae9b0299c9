"""After each observe cycle: give a rightsized job that a site limit stops its request back.

The rule is :mod:`slurmgpu.policy.rightsize_undo`; here the I/O: the cycle's pending jobs
waiting with a reason they never leave, what the audit says the daemon's rightsize
updates lowered, and the update through the actuator (audited first, as every decision;
policy ``rightsize``, alert ``rightsize_undo``). Only while the daemon holds its lease; a
Slurm refusal is audited ``failed`` with Slurm's words and logged, and a store outage
leaves the jobs to a later cycle. The rightsize policy is told which fields of the job's
key not to lower again (at start, for every undo in the audit; then after each). Never
raises for Slurm or the store.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime

from sqlalchemy.exc import SQLAlchemyError

from slurmgpu.actuate.actuator import ActuationResult, Actuator
from slurmgpu.daemon.audited_rule import carry_out_rule
from slurmgpu.model import Job, JobState
from slurmgpu.policy.rightsize import RightsizePolicy
from slurmgpu.policy.rightsize_undo import blamed_fields, stuck_by_limit, undo_action
from slurmgpu.store.audit import AuditStore
from slurmgpu.store.database import StoreError
from slurmgpu.store.health import one_line

__all__ = ["RightsizeUndo"]

log = logging.getLogger("slurmgpu.daemon")


class RightsizeUndo:
    """Undoes the rightsizing of pending jobs that wait with a limit reason for ever."""

    def __init__(
        self, actuator: Actuator, audit: AuditStore, policy: RightsizePolicy | None = None
    ) -> None:
        self.actuator = actuator
        self.audit = audit
        self.policy = policy  # told which keys' fields not to lower again
        self._loaded = policy is None  # the audit's earlier undos told to the policy
        self.undone = 0  # updates Slurm took, since the daemon started

    def _load(self) -> None:
        """Tell the policy of the undos earlier daemons made (once, at the first cycle the
        store answers)."""
        if self._loaded or self.policy is None:
            return
        try:
            undos = self.audit.rightsize_undos()
        except (StoreError, SQLAlchemyError) as exc:
            log.warning("earlier rightsize undos not read (next cycle again): %s", one_line(exc))
            return
        for user, name, partition, reason in undos:
            self.policy.hold_back(user, name, partition, blamed_fields(reason))
        self._loaded = True

    def after_cycle(self, jobs: Sequence[Job], at: datetime) -> list[ActuationResult]:
        """Undo the rightsizing of the jobs among ``jobs`` (the cycle's listing) that wait
        with a reason they never leave, where the rule says so; return the results."""
        self._load()
        stuck = [j for j in jobs if j.state is JobState.PENDING and stuck_by_limit(j.reason)]
        results = carry_out_rule(
            self.actuator,
            stuck,
            self.audit.rightsize_changes,
            undo_action,
            at,
            unread="stuck pending jobs {ids} not checked for a rightsize",
        )
        for r in results:
            if r.outcome != "done":
                continue
            self.undone += 1
            a = r.decision.action
            name, partition = a.numbers.get("name"), a.numbers.get("partition")
            if self.policy is not None and isinstance(name, str) and isinstance(partition, str):
                blamed = blamed_fields(str(a.numbers.get("reason") or ""))
                self.policy.hold_back(a.user, name, partition, blamed)
        return results
