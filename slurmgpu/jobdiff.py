"""What changed between two observations of the job list: a pure function, no I/O.

A leaf beside ``model``: the daemon's observer makes the diff and the store applies it
(``store.jobstore.JobStore.apply_cycle``), so it lives below both. The observer keeps
the previous listing in memory, so a cycle costs one pass over the jobs plus writes
proportional to what changed (the benchmark's 1 % case).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from slurmgpu.model import Job, JobState


@dataclass(frozen=True, slots=True)
class Transition:
    """One event in a job's life: first seen, state change, requeue, gone, vanished."""

    job_id: int
    kind: str  # "submitted" | "state" | "requeue" | "gone" | "vanished"
    from_state: str | None
    to_state: str | None
    restart_count: int = 0


@dataclass(frozen=True, slots=True)
class JobDiff:
    """Result of :func:`diff_jobs`."""

    new: list[Job] = field(default_factory=list)
    changed: list[Job] = field(default_factory=list)
    transitions: list[Transition] = field(default_factory=list)
    gone: list[int] = field(default_factory=list)  # finished jobs Slurm stopped listing
    vanished: list[int] = field(default_factory=list)  # active jobs missing for N cycles
    missing: dict[int, int] = field(default_factory=dict)  # job id → cycles missing so far
    # The listing in its order, an unchanged job as the object seen before: policies
    # that keep a verdict per job know an unchanged one by identity (one ``is``).
    listing: list[Job] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not (self.new or self.changed or self.transitions or self.gone or self.vanished)


_RUNNING_LIKE = frozenset({JobState.RUNNING, JobState.SUSPENDED})


def _transition(prev: Job, cur: Job) -> Transition | None:
    """Return the event that turns ``prev`` into ``cur``, or None if the state is the same."""
    requeued = cur.restart_count > prev.restart_count or (
        cur.state is JobState.PENDING and (prev.state in _RUNNING_LIKE or prev.state.is_terminal)
    )
    if requeued:
        return Transition(
            cur.job_id, "requeue", prev.state.value, cur.state.value, cur.restart_count
        )
    if cur.state is not prev.state:
        return Transition(cur.job_id, "state", prev.state.value, cur.state.value, cur.restart_count)
    return None


def diff_jobs(
    previous: Mapping[int, Job],
    current: Iterable[Job],
    missing: Mapping[int, int] | None = None,
    *,
    vanish_after_cycles: int = 2,
) -> JobDiff:
    """Compare the last listing with this one.

    A job that leaves the listing in a terminal state is ``gone`` (Slurm aged it out after
    MinJobAge). One that leaves while pending or running is only declared ``vanished``
    after ``vanish_after_cycles`` successful listings without it, so one odd answer from
    slurmctld cannot make jobs disappear. A failed listing never reaches this function.
    """
    missing = dict(missing or {})
    diff = JobDiff()
    seen: set[int] = set()
    listing = diff.listing
    for job in current:
        seen.add(job.job_id)
        prev = previous.get(job.job_id)
        if prev is None:
            listing.append(job)
            diff.new.append(job)
            diff.transitions.append(
                Transition(job.job_id, "submitted", None, job.state.value, job.restart_count)
            )
            continue
        missing.pop(job.job_id, None)
        if prev is job or prev == job:
            # Slurm's priority alone moved (it is not stored): the fresh object, no write
            listing.append(prev if prev.priority == job.priority else job)
            continue
        listing.append(job)
        diff.changed.append(job)
        t = _transition(prev, job)
        if t is not None:
            diff.transitions.append(t)
    for job_id, prev in previous.items():
        if job_id in seen:
            continue
        if prev.state.is_terminal:
            diff.gone.append(job_id)
            diff.transitions.append(
                Transition(job_id, "gone", prev.state.value, None, prev.restart_count)
            )
            missing.pop(job_id, None)
            continue
        count = missing.get(job_id, 0) + 1
        if count >= vanish_after_cycles:
            diff.vanished.append(job_id)
            diff.transitions.append(
                Transition(job_id, "vanished", prev.state.value, None, prev.restart_count)
            )
            missing.pop(job_id, None)
        else:
            missing[job_id] = count
    diff.missing.update(missing)
    return diff
