"""Did an interrupted decision happen? Judge it against what Slurm shows after a restart.

A daemon killed between recording a decision (outcome ``pending``) and storing its
outcome cannot know which side of the kill the Slurm change fell. The next daemon asks
Slurm: each interrupted decision is compared with the job as listed now.

- ``requeue``: taken when the job was restarted by a requeue since the decision (its
  restart count is above zero and it is pending again, or it started after the decision);
  not applied when it is still in the run the decision saw.
- ``cancel``: taken when the job is CANCELLED; not applied while it is still active.
- ``update``: the audit's fields are read back into intents
  (:func:`slurmgpu.slurm.update.parse_fields`) and every intent the listing shows
  (:class:`~slurmgpu.intent.SetTimeLimit`, :class:`~slurmgpu.intent.SetCpus`, the GPU
  count of :class:`~slurmgpu.intent.SetGpus`, the shards of
  :class:`~slurmgpu.intent.NarrowToShards`, :class:`~slurmgpu.intent.SetComment`,
  :class:`~slurmgpu.intent.SetMemoryPerNode` of one-node jobs) is compared with the
  job's record: one that differs means not applied, all equal means taken. Verdicts name
  the intents by their ``scontrol`` field (``TimeLimit in place``).
- ``warn``, jobs no longer listed, and intents the listing does not show (or fields that
  do not read back): not confirmed (the audit says so; the next cycle decides again from
  the fresh listing). A ``resize`` is not judged here: its persisted transaction
  (cycle/resize.py, cycle/pool.py) is recovered on its own.

This is pure: it reads an audit record and a :class:`~slurmgpu.model.Job`, nothing else.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from datetime import datetime, timedelta

from slurmgpu.intent import (
    Intent,
    NarrowToMps,
    NarrowToShards,
    SetComment,
    SetCpus,
    SetGpus,
    SetMemoryPerNode,
    SetTimeLimit,
)
from slurmgpu.model import Job, JobState
from slurmgpu.slurm.parse import format_time_limit
from slurmgpu.slurm.update import field_name, parse_fields


class Verdict(enum.StrEnum):
    TAKEN = "taken"
    NOT_APPLIED = "not applied"
    NOT_CONFIRMED = "not confirmed"


# Slurm keeps time limits in whole minutes.
_LIMIT_SLACK = timedelta(seconds=60)


def check(intent: Intent, job: Job) -> tuple[str, bool, str] | None:
    """(the intent's field name, whether ``job`` shows it in place, what the listing
    shows) for one intent; None when the listing does not show it."""
    if isinstance(intent, SetTimeLimit):
        limit, now = intent.limit, job.time_limit
        same = (limit is None and now is None) or (
            limit is not None and now is not None and abs(limit - now) < _LIMIT_SLACK
        )
        return _seen(intent, same, format_time_limit(now))
    if isinstance(intent, SetCpus):
        return _seen(intent, intent.count == job.cpus, str(job.cpus))
    if isinstance(intent, SetComment):
        return _seen(intent, intent.text == job.comment, repr(job.comment))
    if isinstance(intent, SetMemoryPerNode):
        if job.node_count != 1 or job.memory_mib is None:
            return None
        key = field_name(intent)
        return key, intent.mib == job.memory_mib, f"memory {job.memory_mib} MiB"
    if isinstance(intent, SetGpus):
        have = job.gpus.per_node if intent.per_node else job.gpus.per_job
        if have is None:
            return None
        return _seen(intent, intent.count == have, f"gpu {have}")
    if isinstance(intent, NarrowToShards):
        have = job.gpus.shards_per_node
        if have is None:
            return None
        return _seen(intent, intent.shards == have, f"shard {have}")
    if isinstance(intent, NarrowToMps):
        have = job.gpus.mps_per_node
        if have is None:
            return None
        return _seen(intent, intent.share == have, f"mps {have}")
    return None


def _seen(intent: Intent, same: bool, shown: str) -> tuple[str, bool, str]:
    key = field_name(intent)  # Slurm's name of the field, as the audit row shows it
    return key, same, f"{key} {shown}"


def judge(
    kind: str, fields: Mapping[str, str], decided_at: datetime, job: Job | None
) -> tuple[Verdict, str]:
    """Whether an interrupted ``kind`` decision took effect on ``job`` (as listed now).

    ``fields`` are the audit's (:func:`slurmgpu.slurm.update.audit_fields`).
    """
    if kind == "warn":
        return Verdict.NOT_CONFIRMED, "a warning leaves nothing in Slurm to check"
    if job is None:
        return Verdict.NOT_CONFIRMED, "the job is no longer in Slurm's listing"
    state = job.state.value
    if kind == "requeue":
        restarted = job.state is JobState.PENDING or (
            job.start_time is not None and job.start_time > decided_at
        )
        if job.restart_count > 0 and restarted:
            return Verdict.TAKEN, f"restart count {job.restart_count}, {state}"
        if job.state.is_terminal:
            return Verdict.NOT_CONFIRMED, f"the job has ended ({state})"
        return Verdict.NOT_APPLIED, f"restart count {job.restart_count}, still {state}"
    if kind == "cancel":
        if job.state is JobState.CANCELLED:
            return Verdict.TAKEN, "the job is CANCELLED"
        if not job.state.is_terminal:
            return Verdict.NOT_APPLIED, f"the job is still {state}"
        return Verdict.NOT_CONFIRMED, f"the job has ended ({state})"
    if kind == "update":
        intents, _unread = parse_fields(fields, strict=False)
        seen = sorted(r for r in (check(i, job) for i in intents) if r is not None)
        differ = [shown for _key, ok, shown in seen if not ok]
        if differ:
            return Verdict.NOT_APPLIED, "; ".join(differ)
        same = [key for key, _ok, _shown in seen]
        if same:
            return Verdict.TAKEN, f"{', '.join(same)} in place"
        return Verdict.NOT_CONFIRMED, "Slurm's listing does not show the changed fields"
    if kind == "resize":
        return Verdict.NOT_CONFIRMED, "a resize is followed by its own transaction"
    return Verdict.NOT_CONFIRMED, f"{kind} is not checked here"
