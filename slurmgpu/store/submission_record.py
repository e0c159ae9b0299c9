"""A job's submission record, as the daemon writes it from Slurm's own view of the job.

``sgpu submit`` runs as the user and cannot (and must not) write the daemon's store, so
the daemon records the submission itself, the first time its observer lists a job whose
comment carries an ``sgpu:`` token (``sgpu submit`` writes them; a plain ``sbatch
--comment`` can too). Every field comes from Slurm: the uid and user Slurm took from the
submitter's MUNGE credential, the job's work directory, and what the comment's tokens ask
(``slurmgpu.tokens.parse``: malformed tokens count for nothing). Nobody but the job's
owner (or a Slurm operator) can set a job's comment, and nobody but the daemon writes the
store, so a user can record only their own job, and nobody can alter another user's
record. The record is the one of the job as first seen: a comment changed later does not
change it. Slurm keeps no sbatch argument list, so ``argv`` is empty (the command is in
the ``jobs`` row); ``hints["source"]`` is ``"slurm"``.

An array is one submission: its record is keyed by the array's job id.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from slurmgpu.model import Job
from slurmgpu.tokens import parse

__all__ = ["SKEW", "submission_key", "submission_row"]

# A record written up to this long before Slurm's submit time of the job still counts as
# this job's (clocks of hosts differ); an older one is a job id reused after slurmctld
# lost its state, and this job gets a record of its own.
SKEW = timedelta(minutes=5)


def submission_key(job: Job) -> int:
    """The job id a submission is recorded under: the array's for an array task."""
    return job.array_job_id if job.array_job_id is not None else job.job_id


def submission_row(job: Job, cluster: str, at: datetime) -> dict[str, Any] | None:
    """The ``submissions`` row of ``job`` when its comment asks slurmgpu for anything;
    None when it asks nothing or Slurm did not say whose job it is."""
    if "sgpu:" not in job.comment or job.uid is None:
        return None
    given = parse(job.comment)
    hints: dict[str, Any] = {"source": "slurm"}
    if given.rightsize:
        hints["rightsize"] = True
    if given.norightsize:
        hints["norightsize"] = True
    if given.shareable:
        hints["shareable"] = True
    if given.gpu_mem_mib is not None:
        hints["gpu_mem_mib"] = given.gpu_mem_mib
    if given.elastic_dir is not None:
        hints["elastic_dir"] = given.elastic_dir
    if given.malleable is not None:
        hints["pool"] = given.malleable.pool
    if len(hints) == 1 and given.ckpt_signal is None:
        return None  # no token a user gives (sgpu:separated is slurmgpu's own)
    malleable = given.malleable
    return {
        "cluster": cluster,
        "job_id": submission_key(job),
        "submitted_at": job.submit_time or at,
        "uid": job.uid,
        "user": job.user,
        "cwd": job.work_dir,
        "argv": [],
        "malleable_min": malleable.lo if malleable else None,
        "malleable_max": malleable.hi if malleable else None,
        "checkpoint_signal": given.ckpt_signal,
        "checkpoint_grace_s": given.ckpt_grace_s,
        "hints": hints,
    }
