"""Run one policy so that an exception on one job costs that job, not the cycle.

A policy's ``propose`` reads the whole snapshot; a record no one foresaw (a value out of
every range, a bug on one job's shape) raises from deep inside it, and without this the
exception would end the daemon's cycle for every job and every other policy.
:func:`propose_isolated` runs the policy; if it raises, it finds the jobs whose presence
makes it raise (halving the job list: about ``2·log2(n)`` extra runs per bad job, paid
only in a cycle that failed), runs it once more without them, and returns the proposals
with one :class:`PolicyFailure` per job left out. A policy that raises even with no
jobs is skipped for the cycle with one failure naming no job.

Pure: no logging, no I/O; the daemon logs and counts the failures.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from slurmgpu.model import Job
from slurmgpu.policy.base import Action, Policy, PolicySnapshot

__all__ = ["MAX_RUNS", "PolicyFailure", "propose_isolated"]

# Runs of one policy spent looking for bad jobs in one cycle; past it the policy is
# skipped for the cycle (a policy failing on most jobs is broken, not fed a bad record).
MAX_RUNS = 200


@dataclasses.dataclass(frozen=True, slots=True)
class PolicyFailure:
    """A policy raised on ``job_id`` (None: on no job in particular); ``error`` is one line."""

    policy: str
    job_id: int | None
    error: str


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:200]}" if text else type(exc).__name__


def _without(snapshot: PolicySnapshot, jobs: Sequence[Job]) -> PolicySnapshot:
    cluster = dataclasses.replace(snapshot.cluster, jobs=tuple(jobs))
    return dataclasses.replace(snapshot, cluster=cluster)


def _run(policy: Policy, snapshot: PolicySnapshot) -> list[Action]:
    made = policy.propose(snapshot)
    return made if isinstance(made, list) else list(made)


def propose_isolated(
    policy: Policy, snapshot: PolicySnapshot
) -> tuple[list[Action], list[PolicyFailure]]:
    """Return the policy's proposals and the failures that cost a job (or the policy)."""
    try:
        return _run(policy, snapshot), []
    except Exception as first:  # any bug or bad record: isolate it below
        error = _one_line(first)
    runs = 0

    def fails(jobs: Sequence[Job]) -> str | None:
        nonlocal runs
        runs += 1
        try:
            _run(policy, _without(snapshot, jobs))
        except Exception as exc:
            return _one_line(exc)
        return None

    if fails(()) is not None:
        return [], [PolicyFailure(policy.name, None, error)]
    bad: list[tuple[Job, str]] = []
    pending: list[Sequence[Job]] = [snapshot.cluster.jobs]
    while pending:
        group = pending.pop()
        if runs >= MAX_RUNS:
            return [], [PolicyFailure(policy.name, None, f"{error} (on too many jobs)")]
        why = error if group is snapshot.cluster.jobs else fails(group)
        if why is None:
            continue
        if len(group) == 1:
            bad.append((group[0], why))
            continue
        half = len(group) // 2
        pending += [group[half:], group[:half]]
    dropped = {id(job) for job, _ in bad}
    kept = [j for j in snapshot.cluster.jobs if id(j) not in dropped]
    failures = [PolicyFailure(policy.name, job.job_id, why) for job, why in bad]
    try:
        return _run(policy, _without(snapshot, kept)), failures
    except Exception as exc:  # fails only with several bad jobs together: give up this cycle
        return [], [*failures, PolicyFailure(policy.name, None, _one_line(exc))]
