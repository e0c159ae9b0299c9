"""After a cycle: a pure rule, fed by what the audit says of some jobs, carried out.

The daemon's safety nets (:mod:`~slurmgpu.daemon.limit_restore`, a timed-out job's old
limit back; :mod:`~slurmgpu.daemon.rightsize_undo`, a rightsize a site limit stops undone)
share one shape: the jobs of the cycle's listing the net looks at, what the audit knows of
them (one read), the policy module's rule per job, and the resulting actions through the
actuator (audited first, as every decision). A store outage leaves the jobs to a later
cycle: one warning line, nothing carried out. Never raises for the store; the actuator
audits Slurm's refusals.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import TypeVar

from sqlalchemy.exc import SQLAlchemyError

from slurmgpu.actuate.actuator import ActuationResult, Actuator
from slurmgpu.model import Job
from slurmgpu.policy.base import Action, Decision, Mode
from slurmgpu.store.database import StoreError
from slurmgpu.store.health import one_line

__all__ = ["carry_out_rule"]

log = logging.getLogger("slurmgpu.daemon")

Known = TypeVar("Known")


def carry_out_rule(
    actuator: Actuator,
    jobs: Sequence[Job],
    read: Callable[[list[int]], Mapping[int, Known]],
    rule: Callable[[Job, Known | None], Action | None],
    at: datetime,
    *,
    unread: str,
) -> list[ActuationResult]:
    """Read what the audit knows of ``jobs`` (``read``), apply ``rule`` to each and carry
    out the actions it gives, enforced and without mail; the actuator's results. On a
    store error, log ``unread`` (e.g. "timed-out jobs {ids} not checked for a lowered
    limit") with the cause and carry out nothing."""
    if not jobs:
        return []
    try:
        known = read([j.job_id for j in jobs])
    except (StoreError, SQLAlchemyError) as exc:
        log.warning(
            "%s: %s", unread.format(ids=", ".join(str(j.job_id) for j in jobs)), one_line(exc)
        )
        return []
    decisions = [
        Decision(action, Mode.ENFORCE, execute=True, notify=False)
        for job in jobs
        if (action := rule(job, known.get(job.job_id))) is not None
    ]
    return actuator.carry_out(decisions, at) if decisions else []
