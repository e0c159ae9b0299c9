"""After each observe cycle: requeue jobs that ran into a time limit the daemon lowered.

The rule is :mod:`slurmgpu.policy.limit_restore`; here the I/O: the jobs that ended
``TIMEOUT`` in the cycle, what the audit says of their limits, and the requeue through
the actuator (audited first, as every decision; ``requeuehold`` -> update -> release,
:func:`slurmgpu.actuate.separate.separate`). Only while the daemon holds its lease; a
Slurm refusal (a job past ``MinJobAge``, a ``--no-requeue`` job) is audited ``failed``
and logged, and a store outage leaves the jobs to a later cycle's listing as long as
Slurm lists them. Never raises.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from slurmgpu.actuate.actuator import ActuationResult, Actuator
from slurmgpu.daemon.audited_rule import carry_out_rule
from slurmgpu.model import Job, JobState
from slurmgpu.policy.limit_restore import restore_action
from slurmgpu.store.audit import AuditStore

__all__ = ["LimitRestore"]


class LimitRestore:
    """Requeues timed-out jobs whose limit the daemon lowered, with the limit they had."""

    def __init__(self, actuator: Actuator, audit: AuditStore) -> None:
        self.actuator = actuator
        self.audit = audit
        self.restored = 0  # requeues Slurm took, since the daemon started

    def after_cycle(
        self, jobs: Sequence[Job], ended: Sequence[int], at: datetime
    ) -> list[ActuationResult]:
        """Restore the jobs among ``jobs`` (the cycle's listing) that ended ``TIMEOUT``
        in this cycle (``ended``) where the rule says so; return the actuator's results."""
        ids = set(ended)
        timed_out = [j for j in jobs if j.job_id in ids and j.state is JobState.TIMEOUT]
        results = carry_out_rule(
            self.actuator,
            timed_out,
            self.audit.limit_changes,
            restore_action,
            at,
            unread="timed-out jobs {ids} not checked for a lowered limit",
        )
        self.restored += sum(1 for r in results if r.outcome == "done")
        return results
