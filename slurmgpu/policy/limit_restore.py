"""Rightsizing never costs a job its run: the restore of a lowered time limit (pure).

A job whose ``TimeLimit`` the daemon lowered (rightsizing's ``SetTimeLimit``, a resize's
scaled limit) and that then ended ``TIMEOUT`` is requeued with the limit it had before
the first lowering, with ``sgpu:norightsize`` added to its comment so its limit is not
lowered again. Slurm takes a finished batch job back (``scontrol requeuehold``, then the
update while it is held, then ``release``: :func:`slurmgpu.actuate.separate.separate`);
the job keeps its id and its place in the queue (its submit time), restarts after
Slurm's requeue delay (``BeginTime`` ~121 s on) and resumes from the checkpoint its
runtime took at ``SIGTERM``. The simulator does the same (``SimOptions.
restore_lowered_limits``).

The killed run is a ``TIMEOUT`` sample of its key: the daemon's history keeps one per
restore (:class:`~slurmgpu.store.history.HistoryLoader`, from the audit, since the job's
own row ends in another state), so the key's margin grows by
``timeout_margin_growth`` for the next jobs (:mod:`slurmgpu.policy.rightsize`), across
daemon restarts.

Not restored: an array task (Slurm requeues a task by its own id, but the simulator
models no such restore), an interactive allocation (not a batch job: Slurm cannot
requeue it), a job submitted ``--no-requeue``, a job whose limit is not below the one it
had, and a job restored ``MAX_RESTORES`` times already.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import timedelta

from slurmgpu.intent import SetComment, SetTimeLimit
from slurmgpu.model import Job, JobState
from slurmgpu.policy.base import Action
from slurmgpu.tokens import NORIGHTSIZE, add_to_comment, rightsize_opted_out
from slurmgpu.units import format_time_limit

__all__ = ["LIMIT_RESTORE_ALERT", "MAX_RESTORES", "LimitChanges", "restore_action"]

LIMIT_RESTORE_ALERT = "limit_restore"  # the audit's alert of a restore (and its kind's mark)
MAX_RESTORES = 3  # as often as the simulator's users resubmit (SimOptions.max_resubmits)
POLICY = "rightsize"


@dataclass(frozen=True, slots=True)
class LimitChanges:
    """What the audit says of one job's time limit: ``asked_s``, the limit it had before
    the daemon's first executed change of it (None: never changed); ``restores``, how
    often it was requeued with it after a timeout."""

    asked_s: float | None = None
    restores: int = 0


def restore_action(job: Job, changes: LimitChanges | None) -> Action | None:
    """The ``requeue`` action that gives ``job`` back the limit it had, or None when the
    job is not one to restore (module docstring)."""
    if changes is None or changes.asked_s is None or job.state is not JobState.TIMEOUT:
        return None
    if job.array_job_id is not None or not job.batch or not job.requeue:
        return None
    if changes.restores >= MAX_RESTORES or job.time_limit is None:
        return None
    lowered_s = job.time_limit.total_seconds()
    if lowered_s >= changes.asked_s:
        return None
    asked_s = math.ceil(changes.asked_s)
    comment = job.comment
    if not rightsize_opted_out(comment):
        comment = add_to_comment(comment, [NORIGHTSIZE])
    run_s = (
        (job.end_time - job.start_time).total_seconds()
        if job.end_time is not None and job.start_time is not None
        else lowered_s
    )
    return Action(
        POLICY,
        "requeue",
        job.job_id,
        job.user,
        f"ran into its lowered time limit {format_time_limit(job.time_limit)}: requeued "
        f"with the {format_time_limit(timedelta(seconds=asked_s))} it had, not lowered again",
        {
            "time_limit_s": lowered_s,
            "restored_time_limit_s": asked_s,
            "run_time_s": run_s,
            "name": job.name,
            "partition": job.partition,
            "gpus": job.gpus.gpus,
            "cpus": job.cpus,
            "restarts": job.restart_count,
            "restores": changes.restores + 1,
        },
        (SetTimeLimit(asked_s), SetComment(comment)),
        LIMIT_RESTORE_ALERT,
        protective=True,
    )
