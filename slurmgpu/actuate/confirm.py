"""Did an interrupted decision happen? Judge it against what Slurm shows after a restart.

A daemon killed between recording a decision (outcome ``pending``) and storing its
outcome cannot know which side of the kill the Slurm change fell. The next daemon asks
Slurm: each interrupted decision is compared with the job as listed now.

- ``requeue``: taken when the job was restarted by a requeue since the decision (its
  restart count is above zero and it is pending again, or it started after the decision);
  not applied when it is still in the run the decision saw.
- ``cancel``: taken when the job is CANCELLED; not applied while it is still active.
- ``update``: every field that the listing shows (``TimeLimit``, ``NumCPUs``, the GPU
  and shard counts of ``TresPerNode`` / ``TresPerJob``, ``Comment``, ``MinMemoryNode`` of
  one-node jobs) is compared: one that differs means not applied, all equal means taken.
- ``warn``, jobs no longer listed, and fields the listing does not show: not confirmed
  (the audit says so; the next cycle decides again from the fresh listing). A
  ``resize`` is not judged here: its persisted transaction (actuate/resize.py,
  actuate/pool.py) is recovered on its own.

This is pure: it reads an audit record and a :class:`~slurmgpu.model.Job`, nothing else.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from datetime import datetime, timedelta

from slurmgpu.model import Job, JobState
from slurmgpu.slurm.parse import (
    SlurmValueError,
    format_time_limit,
    parse_memory_mib,
    parse_time_limit,
)


class Verdict(enum.StrEnum):
    TAKEN = "taken"
    NOT_APPLIED = "not applied"
    NOT_CONFIRMED = "not confirmed"


# Slurm keeps time limits in whole minutes.
_LIMIT_SLACK = timedelta(seconds=60)


def _tres_count(text: str, name: str) -> int | None:
    """The ``name`` (gpu, shard) count in ``gres/gpu:a100:2`` / ``gres:shard:4``; None if absent."""
    for raw in text.split(","):
        parts = raw.strip().removeprefix("gres/").removeprefix("gres:").split(":")
        if parts[0] == name:
            return int(parts[-1]) if len(parts) > 1 and parts[-1].isdigit() else 1
    return None


def _field(job: Job, key: str, value: str) -> tuple[bool, str] | None:
    """(matches, what the listing shows) for one update field; None if not listed."""
    try:
        if key == "TimeLimit":
            limit = parse_time_limit(value)
            now = job.time_limit
            same = (limit is None and now is None) or (
                limit is not None and now is not None and abs(limit - now) < _LIMIT_SLACK
            )
            return same, f"TimeLimit {format_time_limit(now)}"
        if key == "NumCPUs":
            return int(value) == job.cpus, f"NumCPUs {job.cpus}"
        if key == "Comment":
            return value == job.comment, f"Comment {job.comment!r}"
        if key == "MinMemoryNode":
            if job.node_count != 1 or job.memory_mib is None:
                return None
            return parse_memory_mib(value) == job.memory_mib, f"memory {job.memory_mib} MiB"
        if key in ("TresPerNode", "TresPerJob"):
            per_node = key == "TresPerNode"
            for name, have in (
                ("gpu", job.gpus.per_node if per_node else job.gpus.per_job),
                ("shard", job.gpus.shards_per_node if per_node else None),
            ):
                want = _tres_count(value, name)
                if want is not None:
                    if have is None:
                        return None
                    return want == have, f"{key} {name} {have}"
            return None
    except (SlurmValueError, ValueError):
        return None
    return None


def judge(
    kind: str, fields: Mapping[str, str], decided_at: datetime, job: Job | None
) -> tuple[Verdict, str]:
    """Whether an interrupted ``kind`` decision took effect on ``job`` (as listed now)."""
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
        seen = [(key, _field(job, key, value)) for key, value in sorted(fields.items())]
        differ = [r[1] for _key, r in seen if r is not None and not r[0]]
        if differ:
            return Verdict.NOT_APPLIED, "; ".join(differ)
        same = [key for key, r in seen if r is not None]
        if same:
            return Verdict.TAKEN, f"{', '.join(same)} in place"
        return Verdict.NOT_CONFIRMED, "Slurm's listing does not show the changed fields"
    if kind == "resize":
        return Verdict.NOT_CONFIRMED, "a resize is followed by its own transaction"
    return Verdict.NOT_CONFIRMED, f"{kind} is not checked here"
