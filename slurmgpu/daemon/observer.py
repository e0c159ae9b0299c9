"""The observe step: one job listing + one node listing → diff → one stored transaction.

When active jobs drop out of the listing without a terminal state (``vanished``: a
slurmctld restart lost them, or they ended and aged out between two polls) and the client
also offers :class:`~slurmgpu.slurm.client.AccountingClient`, the observer asks ``sacct``
once for all of them: a job accounting knows as finished is recorded with its real end
state, times and exit code (a ``state`` event to that state, then ``gone``) instead of
``vanished``. A failed or unavailable accounting lookup leaves the cycle as it was.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

from slurmgpu.daemon.gres_watch import GresUsageWatch
from slurmgpu.jobdiff import JobDiff, Transition, diff_jobs
from slurmgpu.model import ClusterSnapshot, Job, JobState, Node
from slurmgpu.nodeusage import reconcile
from slurmgpu.slurm.client import (
    AccountingClient,
    SlurmClient,
    SlurmError,
    SlurmParseError,
    SlurmUnavailableError,
)
from slurmgpu.store.database import StoreError
from slurmgpu.store.jobstore import JobStore

log = logging.getLogger("slurmgpu.daemon")


def utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True, slots=True)
class CycleResult:
    """What one cycle did; ``ok`` is False when the cycle was skipped and state kept."""

    ok: bool
    at: datetime
    error: str = ""
    jobs_seen: int = 0
    new: int = 0
    changed: int = 0
    transitions: int = 0
    gone: int = 0
    vanished: int = 0
    nodes_changed: int = 0
    ended: tuple[int, ...] = ()  # jobs that reached a terminal state in this cycle
    seconds: float = 0.0
    timings: dict[str, float] = field(default_factory=dict)
    snapshot: ClusterSnapshot | None = None


class Observer:
    """Keeps the last listing in memory and stores only what changed.

    On construction it reloads the unfinished jobs from the store, so a restarted daemon
    diffs against what it recorded before, not against nothing.
    """

    def __init__(
        self,
        slurm: SlurmClient,
        store: JobStore,
        *,
        vanish_after_cycles: int = 2,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self.slurm = slurm
        self.store = store
        self.vanish_after_cycles = vanish_after_cycles
        self.clock = clock
        active = store.active_jobs()
        self._jobs: dict[int, Job] = {jid: job for jid, (_, job) in active.items()}
        self._row_ids: dict[int, int] = {jid: rid for jid, (rid, _) in active.items()}
        self._missing: dict[int, int] = {}
        self._nodes: dict[str, Node] = store.known_nodes()
        # Where Slurm's node gres_used disagrees with the running jobs' allocations.
        self.gres = GresUsageWatch()
        # The last successful snapshot, for the API thread (replaced whole, never mutated).
        # Until the first cycle it is what the store remembers, so agents reporting right
        # after a daemon restart are recognised instead of refused as unknown nodes.
        self.latest: ClusterSnapshot | None = (
            ClusterSnapshot(
                taken_at=clock(), jobs=tuple(self._jobs.values()), nodes=tuple(self._nodes.values())
            )
            if self._nodes
            else None
        )

    def _keep_placement(self, job: Job) -> Job:
        """A finished job as squeue lists it has lost its GPU indices (no gres_detail any
        more); keep the ones we saw while it ran, so reports can say which GPUs it held."""
        if job.gpu_allocations or not job.state.is_terminal:
            return job
        prev = self._jobs.get(job.job_id)
        if prev is None or not prev.gpu_allocations:
            return job
        return replace(job, gpu_allocations=prev.gpu_allocations, nodes=job.nodes or prev.nodes)

    def cycle(self) -> CycleResult:
        """Observe once; never raises for Slurm or store trouble (the result says why)."""
        at = self.clock()
        t0 = time.perf_counter()
        try:
            jobs = self.slurm.jobs()
            t_jobs = time.perf_counter()
            nodes = self.slurm.nodes()
            t_nodes = time.perf_counter()
        except SlurmUnavailableError as exc:
            return CycleResult(
                False, at, f"slurm unavailable: {exc}", seconds=time.perf_counter() - t0
            )
        except SlurmParseError as exc:
            return CycleResult(
                False, at, f"slurm output not understood: {exc}", seconds=time.perf_counter() - t0
            )
        except SlurmError as exc:
            return CycleResult(False, at, f"slurm error: {exc}", seconds=time.perf_counter() - t0)
        return self.apply(
            jobs, nodes, at, t0=t0, t_fetch={"jobs": t_jobs - t0, "nodes": t_nodes - t_jobs}
        )

    def _version(self) -> str:
        """Slurm's release for the snapshot (policies spell GRES updates by it); '' if unknown.

        The CLI backend learns it from squeue's own output or asks sinfo once, then caches.
        """
        try:
            return self.slurm.version()
        except SlurmError:
            return ""

    def apply(
        self,
        jobs: list[Job],
        nodes: list[Node],
        at: datetime,
        *,
        t0: float | None = None,
        t_fetch: dict[str, float] | None = None,
    ) -> CycleResult:
        """Diff a listing against memory and store it (the cycle minus the listings).

        Vanished jobs are looked up in accounting when the client can (one call).
        """
        t0 = time.perf_counter() if t0 is None else t0
        t_diff0 = time.perf_counter()
        jobs = [self._keep_placement(j) for j in jobs]
        # A node's usage is what its running jobs hold (Slurm's gres_used can forget
        # shards across a slurmctld restart); differences are logged once and counted.
        nodes, findings = reconcile(nodes, jobs)
        diff: JobDiff = diff_jobs(
            self._jobs, jobs, self._missing, vanish_after_cycles=self.vanish_after_cycles
        )
        changed_nodes = [n for n in nodes if self._nodes.get(n.name) != n]
        t_diff = time.perf_counter()
        t_acct = 0.0
        if diff.vanished and isinstance(self.slurm, AccountingClient):
            diff = self._resolve_vanished(diff, self.slurm)
            t_acct = time.perf_counter() - t_diff
            t_diff = time.perf_counter()
        row_ids = dict(self._row_ids)
        try:
            self.store.apply_cycle(diff, row_ids, changed_nodes, at)
        except StoreError as exc:
            return CycleResult(False, at, str(exc), seconds=time.perf_counter() - t0)
        t_store = time.perf_counter()
        # Commit to memory only after the database has the cycle.
        self._row_ids = row_ids
        self._missing = diff.missing
        for job in diff.new:
            self._jobs[job.job_id] = job
        for job in diff.changed:
            self._jobs[job.job_id] = job
        for job_id in (*diff.gone, *diff.vanished):
            self._jobs.pop(job_id, None)
        for node in changed_nodes:
            self._nodes[node.name] = node
        self.gres.observe(findings)
        ended = tuple(
            t.job_id
            for t in diff.transitions
            if t.to_state is not None
            and t.kind in {"state", "submitted"}
            and JobState(t.to_state).is_terminal
        )
        # An unchanged job is the object of the last snapshot (equal, and known by
        # identity to the policies that keep verdicts per job).
        snapshot = ClusterSnapshot(
            taken_at=at,
            jobs=tuple(diff.listing),
            nodes=tuple(nodes),
            slurm_version=self._version(),
        )
        self.latest = snapshot
        timings = dict(t_fetch or {})
        timings.update(diff=t_diff - t_diff0 - t_acct, store=t_store - t_diff)
        if t_acct:
            timings["sacct"] = t_acct
        return CycleResult(
            True,
            at,
            jobs_seen=len(jobs),
            new=len(diff.new),
            changed=len(diff.changed),
            transitions=len(diff.transitions),
            gone=len(diff.gone),
            vanished=len(diff.vanished),
            nodes_changed=len(changed_nodes),
            ended=ended,
            seconds=time.perf_counter() - t0,
            timings=timings,
            snapshot=snapshot,
        )

    def _resolve_vanished(self, diff: JobDiff, accounting: AccountingClient) -> JobDiff:
        """Turn vanished jobs that ``sacct`` knows as finished into state change + gone."""
        try:
            finished = accounting.finished_jobs(list(diff.vanished))
        except SlurmError as exc:
            log.warning("sacct lookup of %d vanished job(s) failed: %s", len(diff.vanished), exc)
            return diff
        except Exception:  # optional enrichment: never let it break the cycle
            log.exception("sacct lookup of %d vanished job(s) failed", len(diff.vanished))
            return diff
        resolved: dict[int, Job] = {}
        for acct in finished:
            prev = self._jobs.get(acct.job_id)
            if prev is None or acct.job_id not in diff.vanished or not acct.state.is_terminal:
                continue
            if (
                acct.submit_time is not None
                and prev.submit_time is not None
                and acct.submit_time < prev.submit_time
            ):
                continue  # an older job that had the same id: not this one
            resolved[acct.job_id] = merge_accounting(prev, acct)
        if not resolved:
            return diff
        transitions: list[Transition] = []
        for t in diff.transitions:
            job = resolved.get(t.job_id)
            if t.kind != "vanished" or job is None:
                transitions.append(t)
                continue
            transitions.append(
                Transition(t.job_id, "state", t.from_state, job.state.value, job.restart_count)
            )
            transitions.append(
                Transition(t.job_id, "gone", job.state.value, None, job.restart_count)
            )
        log.info(
            "sacct: %d of %d vanished job(s) finished: %s",
            len(resolved),
            len(diff.vanished),
            ", ".join(f"{jid} {job.state.value}" for jid, job in sorted(resolved.items())),
        )
        return JobDiff(
            new=diff.new,
            changed=[*diff.changed, *resolved.values()],
            transitions=transitions,
            gone=[*diff.gone, *resolved],
            vanished=[jid for jid in diff.vanished if jid not in resolved],
            missing=diff.missing,
            listing=diff.listing,
        )


def merge_accounting(prev: Job, acct: Job) -> Job:
    """The last listed ``prev`` with what accounting knows of its end.

    State, reason, end time and exit code come from ``acct`` (the listed end and, for a
    pending job, start were only Slurm's projections); the start time of a job that ran,
    nodes and restart count too when it has them. Everything only the controller knew
    (GPU indices, the request, the submit time the store keys the row by) stays as listed.
    """
    listed_start = None if prev.state is JobState.PENDING else prev.start_time
    return replace(
        prev,
        state=acct.state,
        state_flags=acct.state_flags,
        reason=acct.reason,
        start_time=acct.start_time or listed_start,
        end_time=acct.end_time,
        exit_code=acct.exit_code,
        nodes=prev.nodes or acct.nodes,
        restart_count=max(prev.restart_count, acct.restart_count),
    )
